"""Answers: what does a differentiable activation call cost the host through tunekit (its public function,
and torch's F.silu / F.gelu patched by tunekit.patch) against torch's own, once tuned and cached? Forward +
backward through autograd, medians of interleaved repeats, on the CPU (the host path only; on a GPU
pass --device cuda). ``--cuda-c``: silu and gelu tanh decided to their CUDA C float32 kernels (the case
where the fast call records torch's node itself); ``--recorder-too``: each also timed without that (the op's
Python function and its GradCall take the call, as before 2026-11-26 afternoon), interleaved in one process;
``--takes-too``: each also with routing's checks in Python (before ``backends/fast_route.cpp``).
``PYTHONPATH=src python benchmarks/experiments/activation_patched_host_probe.py [N] [--device cuda] [--cuda-c] [--recorder-too] [--takes-too]``
"""
import argparse
import statistics

import torch
import torch.nn.functional as F

import tunekit
from tunekit.backends import fast_call, fast_grad, fast_route
from tunekit.bench.measure import host_us_per_call
from tunekit.ops._shared import routing
from tunekit.ops._shared.grad_call import recorder_slot
from tunekit.tunable import results_store, validators
from tunekit.tunable.entries import CandidateRecord, Entry
from tunekit.tunable.registry import get_op


def force_cuda_c(x) -> None:
    """Store silu_f32 / gelu_tanh_f32 as the choices for x's signatures."""
    for op, choice, extra in ((get_op("silu"), "silu_f32", ()), (get_op("gelu"), "gelu_tanh_f32", ("tanh",))):
        signature = op.make_params(x.detach(), *extra).signature()
        results_store().put(Entry(op=op.name, signature=signature, device=validators.device_name(x.device),
                                  choice=choice, complete=True, validators=validators.validators_for(x.device, op.candidates),
                                  candidates={choice: CandidateRecord("chosen", 0.01)}, tuned_at=0.0, tuning_ms=1.0))


def timed(fns: dict, device, recorder_too: bool, takes_too: bool = False, repeats: int = 21) -> dict:
    """Median host us per call of each function; with ``recorder_too`` each also without the fast
    calls' recorder (the slots emptied: the op's Python function and GradCall take the call), with
    ``takes_too`` each also with routing's checks in Python (``python_takes``) instead of the C++
    ones, the modes interleaved repeat by repeat in this one process."""
    slots = {kind: recorder_slot(kind)[0] for kind in ("silu", "gelu")}
    native = routing._checks
    modes = {"": (True, native)}
    if recorder_too:
        modes[" (no recorder)"] = (False, native)
    if takes_too:
        modes[" (Python takes)"] = (True, routing.python_takes)
    samples = {name + mode: [] for name in fns for mode in modes}
    try:
        for _ in range(repeats):
            for mode, (with_recorder, checks) in modes.items():
                for kind, recorder in slots.items():
                    recorder_slot(kind)[0] = recorder if with_recorder else None
                routing._checks = checks
                for name, us in host_us_per_call(fns, device, calls=4000, repeats=1).items():
                    samples[name + mode].append(us)
    finally:
        routing._checks = native
        for kind, recorder in slots.items():
            recorder_slot(kind)[0] = recorder
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", type=int, nargs="?", default=4096)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cuda-c", action="store_true")
    ap.add_argument("--recorder-too", action="store_true")
    ap.add_argument("--takes-too", action="store_true")
    args = ap.parse_args()
    device = torch.device(args.device)
    fast_grad.load()
    fast_call.load()
    x = torch.randn(args.n, device=device, requires_grad=True)
    g = torch.ones(args.n, device=device)
    if args.cuda_c:
        force_cuda_c(x)
    orig_gelu, orig_silu = F.gelu, F.silu

    def fb(f):
        def run():
            f(x).backward(g)
        return run
    fns = {"F.gelu tanh": fb(lambda t: orig_gelu(t, approximate="tanh")),
           "tunekit.gelu tanh": fb(lambda t: tunekit.gelu(t, approximate="tanh")),
           "F.silu": fb(orig_silu), "tunekit.silu": fb(tunekit.silu)}
    with tunekit.patch(["silu", "gelu"]):
        fns["patched F.gelu tanh"] = fb(lambda t: F.gelu(t, approximate="tanh"))
        fns["patched F.silu"] = fb(lambda t: F.silu(t))
        with tunekit.tuning(tuning_step_ms=float("inf")):  # each signature tuned in its first call, compiles awaited
            for f in fns.values():
                for _ in range(500):  # tuned and cached before timing
                    f()
        fast_grad.when_loaded.settle()
        fast_route.when_loaded.settle()
        times = timed(fns, device, args.recorder_too, args.takes_too)
    plain = x.detach()
    choices = {"silu": get_op("silu").decision(get_op("silu").make_params(plain)).candidate.name,
               "gelu tanh": get_op("gelu").decision(get_op("gelu").make_params(plain, "tanh")).candidate.name}
    print(f"# choices {choices}")
    for name, us in times.items():
        print(f"{args.n} {args.device} fwd+bwd {name:38s} {us:7.2f} us")


if __name__ == "__main__":
    main()
