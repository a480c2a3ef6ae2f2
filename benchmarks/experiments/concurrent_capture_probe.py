"""Answers: when a user's thread captures a CUDA graph while another thread (tuning) captures one of its own,
which part of torch breaks the user's capture, and would tuning's graphs made with the driver's capture API
(no torch.cuda.CUDAGraph: no default-generator registration, no allocator pool) leave the user's capture whole?

Each case runs in a fresh process (a failed capture can leave torch's generator capturing for the process).
U: the user's thread, ``torch.cuda.graph(g, stream=own, capture_error_mode="thread_local")`` with or without a
``torch.randn`` inside. T: the other thread, on a stream of its own, THREAD_LOCAL, capturing ``torch.mul(x, 2,
out=y)`` (no allocation) either with ``torch.cuda.CUDAGraph`` or with ``cuStreamBeginCapture`` /
``cuStreamEndCapture``, or (``device_sync``) not capturing but calling ``torch.cuda.synchronize()``. Only stream
synchronizations otherwise. Orders: T's whole capture inside U's ("T in U"), or U's whole capture inside T's ("U in T"; "U* in T": U calls
``CUDAGraph.capture_begin`` / ``capture_end`` itself, without ``torch.cuda.graph``'s device synchronize and
``empty_cache`` on entry).
Usage: ``python concurrent_capture_probe.py`` (all cases, a table).
"""

from __future__ import annotations

import subprocess
import sys
import threading

CASES = [(t, randn, order) for t in ("torch", "driver") for randn in (True, False) for order in ("T in U", "U in T", "U* in T")] \
    + [("device_sync", False, "T in U")]


def _driver_capture_parts(stream, x, y):
    from cuda.bindings import driver as cu

    handle = cu.CUstream(stream.cuda_stream)

    def begin():
        err, = cu.cuStreamBeginCapture(handle, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        assert int(err) == 0, err
        with torch.cuda.stream(stream):
            torch.mul(x, 2, out=y)

    def end():
        err, graph = cu.cuStreamEndCapture(handle)
        assert int(err) == 0, err
        err, exe = cu.cuGraphInstantiate(graph, 0)
        assert int(err) == 0, err
        return lambda: cu.cuGraphLaunch(exe, handle)
    return begin, end


def _torch_capture_parts(stream, x, y):
    g = torch.cuda.CUDAGraph()

    def begin():
        with torch.cuda.stream(stream):
            g.capture_begin(capture_error_mode="thread_local")
            torch.mul(x, 2, out=y)

    def end():
        with torch.cuda.stream(stream):
            g.capture_end()
        return g.replay
    return begin, end


def _device_sync_parts(stream, x, y):
    """No capture: a device-wide synchronize (what tuning's screen did) in the other thread."""
    def begin():
        torch.cuda.synchronize()

    def end():
        with torch.cuda.stream(stream):
            return lambda: torch.mul(x, 2, out=y)
    return begin, end


PARTS = {"torch": _torch_capture_parts, "driver": _driver_capture_parts, "device_sync": _device_sync_parts}


def run_case(tuner: str, randn: bool, order: str) -> str:
    x = torch.randn(1 << 20, device="cuda")
    y, u_out = torch.empty_like(x), torch.empty_like(x)
    u_stream, t_stream = torch.cuda.Stream(), torch.cuda.Stream()
    u_began, t_done, t_began, u_done = (threading.Event() for _ in range(4))
    result = {}

    def user():
        try:
            if order != "T in U":
                t_began.wait()
            g = torch.cuda.CUDAGraph()
            if order == "U* in T":
                u_stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(u_stream):
                    g.capture_begin(capture_error_mode="thread_local")
                    u_out.copy_((torch.randn_like(x) if randn else x) + 1)
                    g.capture_end()
            else:
                with torch.cuda.graph(g, stream=u_stream, capture_error_mode="thread_local"):
                    u_began.set()
                    if order == "T in U":
                        t_done.wait()
                    noise = torch.randn_like(x) if randn else x
                    u_out.copy_(noise + 1)
            with torch.cuda.stream(u_stream):
                g.replay()
            u_stream.synchronize()
            result["U"] = "ok"
        except Exception as exc:  # noqa: BLE001 - the outcome is the result
            result["U"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:90]}"
        finally:
            u_began.set()
            u_done.set()

    def tuning():
        try:
            if order == "T in U":
                u_began.wait()
            begin, end = PARTS[tuner](t_stream, x, y)
            begin()
            t_began.set()
            if order != "T in U":
                u_done.wait()
            replay = end()
            with torch.cuda.stream(t_stream):
                replay()
            t_stream.synchronize()  # never a device-wide synchronize: it would break a capture in progress
            result["T"] = "ok" if torch.equal(y, x * 2) else "wrong"
        except Exception as exc:  # noqa: BLE001
            result["T"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:90]}"
        finally:
            t_began.set()
            t_done.set()

    threads = [threading.Thread(target=user), threading.Thread(target=tuning)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        torch.randn(8, device="cuda")
        after = "ok"
    except Exception as exc:  # noqa: BLE001
        after = f"{type(exc).__name__}: {str(exc).splitlines()[0][:70]}"
    return f"| {tuner} | {randn} | {order} | {result.get('U')} | {result.get('T')} | {after} |"


if __name__ == "__main__":
    if len(sys.argv) == 4:
        import torch

        print(run_case(sys.argv[1], sys.argv[2] == "True", sys.argv[3]), flush=True)
    else:
        print("| tuning's capture | randn in U's capture | order | U's capture | T's capture | eager randn after |")
        print("|---|---|---|---|---|---|")
        for case in CASES:
            out = subprocess.run([sys.executable, __file__, *map(str, case)], capture_output=True, text=True, timeout=120)
            line = [l for l in out.stdout.splitlines() if l.startswith("|")]
            print(line[-1] if line else f"| {' | '.join(map(str, case))} | process rc {out.returncode}: "
                  f"{(out.stderr.strip().splitlines() or [''])[-1][:120]} | | |", flush=True)
