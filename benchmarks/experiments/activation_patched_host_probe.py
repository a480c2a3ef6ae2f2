"""Answers: what does a differentiable activation call cost the host through tunekit (its public function,
and torch's F.silu / F.gelu patched by tunekit.patch) against torch's own, once tuned and cached? Forward +
backward through autograd, medians of interleaved repeats, on the CPU (the host path only; on a GPU
pass --device cuda). ``PYTHONPATH=src python benchmarks/experiments/activation_patched_host_probe.py [N] [--device cuda]``
"""
import argparse

import torch
import torch.nn.functional as F

import tunekit
from tunekit.backends import fast_call, fast_grad
from tunekit.bench.measure import host_us_per_call


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", type=int, nargs="?", default=4096)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    fast_grad.load()
    fast_call.load()
    x = torch.randn(args.n, device=device, requires_grad=True)
    g = torch.ones(args.n, device=device)
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
        times = host_us_per_call(fns, device, calls=4000, repeats=21)
    for name, us in times.items():
        print(f"{args.n} {args.device} fwd+bwd {name:24s} {us:7.2f} us")


if __name__ == "__main__":
    main()
