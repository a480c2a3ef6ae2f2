"""Many processes on one results file: 16 writers x 100 entries while 4 readers read, and afterwards
every entry is there, in the main file itself (a copy of it alone has them all)."""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

from tunekit.tunable.results import ResultsStore

SRC = str(pathlib.Path(__file__).resolve().parents[2] / "src")

#: the store's module without the package's __init__ (which imports torch: seconds per process); the
#: results store is stdlib only, so 20 processes start in well under a second each
PRELUDE = f"""
import sys, types
for name, folder in (("tunekit", {SRC!r} + "/tunekit"), ("tunekit.tunable", {SRC!r} + "/tunekit/tunable")):
    module = types.ModuleType(name)
    module.__path__ = [folder]
    sys.modules[name] = module
from tunekit.tunable.results import ResultsStore
from tunekit.tunable.entries import CandidateRecord, Entry
import pathlib, time, warnings, json
warnings.simplefilter("error")  # falling back to memory would lose writes: fail instead
path, rank, flags = sys.argv[1], int(sys.argv[2]), pathlib.Path(sys.argv[3])
(flags / f"ready-{{rank}}").touch()
while not (flags / "go").exists():
    time.sleep(0.005)
"""

WRITER = PRELUDE + """
store = ResultsStore(path)
for i in range(100):  # one small transaction per entry
    store.put(Entry("op", f"w{rank}-{i}", "cpu", "c", True, {"rank": str(rank)},
                    {"c": CandidateRecord("chosen", float(i))}, time.time(), 1.0))
"""

READER = PRELUDE + """
store = ResultsStore(path)
counts = []
while True:  # reads at least once after the writers are done, however the 20 processes were scheduled
    done = (flags / "writers-done").exists()
    n = len(store)
    entries = store.entries("op")
    assert len(entries) >= n, (len(entries), n)  # never fewer than a moment ago
    assert not counts or n >= counts[-1], (counts[-1], n)
    counts.append(n)
    if done:
        break
print(json.dumps({"reads": len(counts), "last": counts[-1]}))
"""


def start(code, path, rank, flags):
    env = dict(os.environ, PYTHONPATH=SRC)
    return subprocess.Popen([sys.executable, "-c", code, str(path), str(rank), str(flags)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_sixteen_writers_and_four_readers_leave_every_entry_in_the_main_file(tmp_path):
    path = tmp_path / "shared" / "results.sqlite"
    ResultsStore(path).close()  # the readers open an existing store
    flags = tmp_path / "flags"
    flags.mkdir()
    writers = [start(WRITER, path, rank, flags) for rank in range(16)]
    readers = [start(READER, path, 100 + rank, flags) for rank in range(4)]
    everyone = writers + readers
    try:
        deadline = time.monotonic() + 60
        while len(list(flags.glob("ready-*"))) < len(everyone):
            assert time.monotonic() < deadline, "the processes did not start"
            assert all(p.poll() is None for p in everyone), [p.communicate() for p in everyone if p.poll() is not None]
            time.sleep(0.01)
        started = time.monotonic()
        (flags / "go").touch()
        for p in writers:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
        elapsed = time.monotonic() - started
        (flags / "writers-done").touch()
        reads = []
        for p in readers:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            reads.append(json.loads(out))
    finally:
        for p in everyone:
            if p.poll() is None:
                p.kill()
    # how many reads fell while the writers wrote depends on how 20 processes share the cores (on 2
    # cores a reader may get none in): what must hold is that every read went up, never down (checked
    # in the readers) and that the read after the writers finished sees every entry
    assert [r["last"] for r in reads] == [1600] * 4 and elapsed < 60
    assert sorted(os.listdir(path.parent)) == ["results.sqlite"]  # no journal or WAL left beside it
    copy = tmp_path / "copy.sqlite"
    shutil.copyfile(path, copy)  # the main file alone
    expected = {f"w{rank}-{i}" for rank in range(16) for i in range(100)}
    assert {e.signature for e in ResultsStore(copy).entries()} == expected
