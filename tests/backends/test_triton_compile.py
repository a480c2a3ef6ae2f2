"""Triton compiles in worker processes: a worker's build is the one the calling process's warm-up
finds in Triton's cache (same hash, compiled once), and every failure leaves the compile to the
calling process.

No GPU is needed: Triton compiles for a target it is given (sm_90), and a stand-in driver answers
the device questions a warm-up asks; nothing is launched. Each scenario runs in a fresh process
(``triton_compile_scenarios.py``): this one interprets Triton kernels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

from tunekit.backends import triton_workers  # noqa: E402

SCENARIOS = Path(__file__).with_name("triton_compile_scenarios.py")


def run(scenario: str, cache: Path, **env) -> dict:
    environment = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TUNEKIT_TRITON_SUBPROCESS")}
    environment.update(TRITON_CACHE_DIR=str(cache), **env)
    done = subprocess.run([sys.executable, str(SCENARIOS), scenario], capture_output=True, text=True,
                          env=environment, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_workers_build_is_the_one_the_warm_up_finds(tmp_path):
    result = run("one", tmp_path)
    assert result["stats"] == {"offloaded": 1, "found": 1, "rebuilt": 0, "failed": 0, "cached": 0}
    assert result["builds"] == 1 and not result["left_in_process"]  # compiled once: by the worker


def test_each_new_specialization_is_offloaded_and_a_known_one_is_not(tmp_path):
    result = run("three", tmp_path)
    assert result["stats"] == {"offloaded": 2, "found": 2, "rebuilt": 0, "failed": 0, "cached": 0}
    assert result["builds"] == 2


def test_the_gemm_kernel_at_odd_sizes_is_found_too(tmp_path):
    """matmul_kernel (None pointers as constexprs, device functions from a sibling module) at
    4097 x 4095 x 4096: the specialization one H100 run found rebuilt; here the worker's build is found."""
    result = run("gemm", tmp_path)
    assert result["stats"]["offloaded"] == 1 and result["stats"]["found"] == 1, result


def test_a_build_already_in_the_cache_is_loaded_here_without_a_worker(tmp_path):
    run("one", tmp_path)
    result = run("warm", tmp_path)
    assert result["stats"] == {"offloaded": 0, "found": 0, "rebuilt": 0, "failed": 0, "cached": 1}
    assert result["builds"] == 1 and result["workers"] == 0


def test_switched_off_the_process_compiles_itself(tmp_path):
    result = run("one", tmp_path, TUNEKIT_TRITON_SUBPROCESS="0")
    assert result["stats"]["offloaded"] == 0 and result["builds"] == 1


def test_a_worker_that_cannot_answer_leaves_the_compile_here(tmp_path):
    result = run("no_worker", tmp_path)
    assert result["stats"] == {"offloaded": 0, "found": 0, "rebuilt": 0, "failed": 1, "cached": 0}
    assert result["builds"] == 1


def test_a_build_the_warm_up_does_not_find_stops_offloading_that_kernel(tmp_path):
    result = run("other_build", tmp_path)
    assert result["stats"] == {"offloaded": 1, "found": 0, "rebuilt": 1, "failed": 0, "cached": 0}
    assert result["left_in_process"] and result["builds"] == 2  # the bfloat16 build was not offloaded


def test_a_users_own_cache_hook_is_kept(tmp_path):
    result = run("users_hook", tmp_path)
    assert len(result["seen"]) == 1 and "rms_norm_forward_kernel" in result["seen"][0]
    assert result["builds"] == 1


def test_a_constexpr_json_cannot_hold_compiles_as_without_the_hook(tmp_path):
    """Triton writes every compile's specialization as JSON once a cache hook is in, the user's
    kernels' too: one JSON cannot hold (a complex here, a Gluon layout in practice) still compiles,
    in the user's own warm-up and through tunekit's launch (there in-process, no worker asked)."""
    result = run("json_unsafe", tmp_path)
    assert result["compiled"] and result["stats"]["offloaded"] == 0 and result["stats"]["failed"] == 0, result


def test_the_worker_reports_errors_and_serves_on(tmp_path):
    """The worker alone: a request for a missing function is answered with its error, and the next
    request is still served; it never imports torch."""
    kernels = Path(triton_workers.__file__).parents[1] / "kernels" / "triton" / "rms_norm.py"
    bad = {"module": "tunekit.kernels.triton.rms_norm", "qualname": "no_such_kernel", "file": str(kernels),
           "target": {"backend": "cuda", "arch": 90, "warp_size": 32}, "specialization": "{}"}
    probe = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__'); print('torch' in sys.modules, file=sys.stderr)"
    done = subprocess.run([sys.executable, "-c", probe, triton_workers._WORKER_FILE],
                          input=json.dumps(bad) + "\n\n" + json.dumps(bad) + "\n", capture_output=True,
                          text=True, env=dict(os.environ, TRITON_CACHE_DIR=str(tmp_path)), timeout=120)
    replies = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(replies) == 2 and all(not r["ok"] and "no_such_kernel" in r["error"] for r in replies)
    assert [r["id"] for r in replies] == [None, None]  # echoed (these requests had none)
    assert done.stderr.strip().splitlines()[-1] == "False"


def test_an_idle_worker_ends_on_its_own(tmp_path):
    """A worker with no request for its idle time ends though its input stays open (so a process
    that compiled once keeps no idle workers), and answers a request that comes in time first."""
    import time
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path), TUNEKIT_TRITON_WORKER_IDLE_S="1")
    worker = subprocess.Popen([sys.executable, triton_workers._WORKER_FILE], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    try:
        worker.stdin.write(json.dumps({"id": 7}) + "\n")
        worker.stdin.flush()
        assert json.loads(worker.stdout.readline())["id"] == 7
        started = time.monotonic()
        assert worker.wait(timeout=60) == 0 and time.monotonic() - started < 30
    finally:
        worker.kill()



def _fresh_key_state(monkeypatch, hash_fn):
    import threading
    from tunekit.backends import triton_compile
    monkeypatch.setattr(triton_compile, "_key_started", False)
    monkeypatch.setattr(triton_compile, "_key_done", threading.Event())
    monkeypatch.setattr(triton_compile, "_hash_key", hash_fn)
    return triton_compile


def test_the_triton_key_is_hashed_once_on_a_thread_of_its_own_and_lookups_wait_for_it(monkeypatch):
    """Triton's key of its install (0.3-0.4 s of hashing, once per process) starts when tunekit
    imports Triton's kernels; a lookup waits for it instead of hashing again."""
    import threading
    import time
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    gate, names = threading.Event(), []

    def slow_hash():
        names.append(threading.current_thread().name)
        gate.wait(10)
        triton_compile._key_done.set()
    triton_compile = _fresh_key_state(monkeypatch, slow_hash)
    triton_compile.wait_for_key()  # none started: returns at once
    triton_compile.hash_triton_key()
    triton_compile.hash_triton_key()
    waiter = threading.Thread(target=triton_compile.wait_for_key)
    waiter.start()
    time.sleep(0.2)
    assert waiter.is_alive(), "a lookup went ahead of the hash"
    gate.set()
    waiter.join(10)
    assert not waiter.is_alive() and names == ["tunekit-triton-key"]


def test_under_the_interpreter_no_key_is_hashed(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    triton_compile = _fresh_key_state(monkeypatch, lambda: pytest.fail("hashed under the interpreter"))
    triton_compile.hash_triton_key()
    assert not triton_compile._key_started


def test_a_warm_up_waits_for_the_key_before_its_lookup(monkeypatch):
    from tunekit.backends import triton as triton_backend
    from tunekit.backends import triton_compile
    order = []
    monkeypatch.setattr(triton_compile, "compile_elsewhere", lambda *a: order.append("elsewhere"))
    monkeypatch.setattr(triton_compile, "wait_for_key", lambda: order.append("key"))
    monkeypatch.setattr(triton_compile, "confirm", lambda *a: None)

    class Kernel:  # a compiled JIT function's stand-in: warmup compiles (here: records)
        def warmup(self, *args, **kwargs):
            order.append("warmup")
    with triton_backend.warming():
        triton_backend.launch(Kernel(), (1,), 3)
    assert order == ["elsewhere", "key", "warmup"]


def test_a_forked_child_waits_for_no_hash_it_does_not_run(monkeypatch):
    """A child forked while the parent hashed has no hashing thread: its lookups must not wait 30 s."""
    import threading
    import time
    triton_compile = _fresh_key_state(monkeypatch, lambda: None)  # a hash that never signals
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    triton_compile.hash_triton_key()
    triton_compile._forked_child()  # what os.register_at_fork runs in the child
    t0 = time.perf_counter()
    triton_compile.wait_for_key(timeout=5)
    assert time.perf_counter() - t0 < 1 and isinstance(triton_compile._key_done, threading.Event)

