"""Wall time of the first call of ``tunekit.silu`` on a new signature (tuning included), per size.

Target (foundation issue): a new elementwise signature tunes in well under 100 ms with the default
budget. Each size is a fresh signature in a fresh in-memory store; CUDA is initialised first.
Run: ``PYTHONPATH=src python benchmarks/suites/tuning_time.py``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import tunekit  # noqa: E402


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"first-call time of tunekit.silu on a new signature, {name}, default budget "
          f"{tunekit.settings().max_tuning_ms:g} ms")
    with tunekit.tuning(results=":memory:"):
        tunekit.silu(torch.randn(100, device=device))
        for dtype in (torch.float32, torch.float16):
            for n in (1 << 12, 1 << 16, 1 << 20, 1 << 24, 1 << 26):
                x = torch.randn(n, device=device, dtype=dtype)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                tunekit.silu(x)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                ms = (time.perf_counter() - t0) * 1e3
                e = tunekit.explain("silu", x)
                times = ", ".join(f"{k}={v[1] * 1e3:.1f}us" for k, v in e.candidates.items() if v[1] is not None)
                print(f"  {str(dtype):15s} n={n:>9}  first call {ms:7.1f} ms  complete={e.complete}  -> {e.chosen}  ({times})")


if __name__ == "__main__":
    main()
