"""Answers: does tunekit's background work (a worker thread loading a kernel module, compiling and
loading a Triton kernel, allocating) break a CUDA graph that the user's thread captures in torch's
default (global) mode? And does the capturing thread's own first load of a kernel break it?

Runs each scenario of ``tests/backends/test_capture_safety.py`` in a fresh process twice: as shipped
(loads inside ``thread_context.capture_relaxed``) and with that guard replaced by a no-op (the code
before it). Prints, per scenario and mode, "ok" or the exception the scenario raised.

GPU only. ``PYTHONPATH=src python benchmarks/experiments/capture_module_load.py``
"""
import contextlib
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2] / "tests" / "backends" / "test_capture_safety.py"
SCENARIOS = ("test_a_worker_loads_a_module_while_the_user_captures",
             "test_the_capturing_thread_loads_a_module_and_launches_it_in_the_graph",
             "test_a_worker_compiles_and_loads_a_triton_kernel_while_the_user_captures",
             "test_a_worker_allocates_in_a_preparation_while_the_user_captures")

CHILD = """
import contextlib, importlib.util, sys, traceback
from tunekit.backends import thread_context
if sys.argv[2] == "unguarded":
    thread_context.capture_relaxed = contextlib.nullcontext
spec = importlib.util.spec_from_file_location("scenarios", sys.argv[3])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
try:
    getattr(module, sys.argv[1])()
    print("ok")
except BaseException as exc:
    print(type(exc).__name__ + ": " + " ".join(str(exc).split())[:300])
"""


def main() -> None:
    for scenario in SCENARIOS:
        for mode in ("guarded", "unguarded"):
            with contextlib.suppress(subprocess.TimeoutExpired):
                done = subprocess.run([sys.executable, "-c", CHILD, scenario, mode, str(TESTS)],
                                      capture_output=True, text=True, timeout=600)
                lines = (done.stdout.strip().splitlines() or [f"no output (rc {done.returncode}): "
                                                              + done.stderr.strip()[-300:]])
                print(f"{scenario} [{mode}]: {lines[-1]}", flush=True)


if __name__ == "__main__":
    main()
