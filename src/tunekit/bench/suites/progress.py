"""Progress of a suite run: ``note`` for one-off facts (the copy bandwidth), ``step`` once per planned
row (measured or not, so the count always reaches the total).

The scripts print every row's line (``LogLines``, what they always did); ``tunekit bench`` shows one
bar (``ProgressBar``): on a terminal, tqdm's when tqdm is installed, else a plain text bar redrawn
in place, so the package needs no new dependency. Elsewhere (CI logs, files) it prints one short
line per row: carriage-return redraws make unreadable logs.
"""

from __future__ import annotations

import shutil
import sys
import time

from .common import log

__all__ = ["LogLines", "ProgressBar"]


class LogLines:
    """Every note and every row as a line on stderr (the benchmark scripts' output)."""

    def note(self, msg: str) -> None:
        log(msg)

    def step(self, msg: str) -> None:
        log(msg)

    def close(self) -> None:
        pass


class ProgressBar:
    """``[#####.....] 12/54  0:31  silu float16 1024x1024: ...`` on stderr; tqdm's bar instead when
    ``use_tqdm`` (None: when the stream is a terminal and tqdm can be imported)."""

    def __init__(self, total: int, *, stream=None, use_tqdm: bool | None = None, width: int = 24):
        self.total, self.done, self.width = max(total, 1), 0, width
        self.stream = stream or sys.stderr
        self.started = time.perf_counter()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._tqdm = None
        if use_tqdm or (use_tqdm is None and self.tty):
            try:
                from tqdm import tqdm
            except ImportError:
                if use_tqdm:
                    raise
            else:
                self._tqdm = tqdm(total=total, file=self.stream, unit="row", dynamic_ncols=True, leave=True)

    def note(self, msg: str) -> None:
        if self._tqdm is not None:
            self._tqdm.write(msg, file=self.stream)
            return
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(msg + "\n")
        self.stream.flush()

    def step(self, msg: str) -> None:
        self.done += 1
        if self._tqdm is not None:
            self._tqdm.set_postfix_str(msg.split(":")[0], refresh=False)
            self._tqdm.update(1)
            return
        filled = self.width * min(self.done, self.total) // self.total
        elapsed = int(time.perf_counter() - self.started)
        line = (f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} "
                f"{elapsed // 60}:{elapsed % 60:02d}  {msg}")
        if self.tty:
            columns = shutil.get_terminal_size((100, 20)).columns
            self.stream.write("\r\033[K" + line[:columns - 1])
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
        elif self.tty:
            self.stream.write("\n")
            self.stream.flush()
