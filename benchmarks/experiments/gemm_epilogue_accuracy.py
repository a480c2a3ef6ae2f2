"""How accurate is torch._addmm_activation (cuBLASLt's bias + GELU epilogue) against a float64 reference,
per dtype, beside torch's addmm followed by gelu(approximate="tanh")? (tests/ops/test_gemm_epilogue.py
found a float16 case 1% off.)

Prints, per dtype, layout and form, the worst |out - ref| / allowed (tests/ops/gemm_checks.py's bound;
<= 1 passes) and the worst relative error. Run: ``PYTHONPATH=src python benchmarks/experiments/gemm_epilogue_accuracy.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "ops"))
from gemm_checks import bound, matrix, randn  # noqa: E402


def worst(out, ref, allowed):
    err = (out.double() - ref).abs()
    return float((err / allowed).max()), float((err / ref.abs().clamp_min(1e-3)).max())


def main() -> None:
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(dev), torch.__version__, "reduced-precision fp16 reduction:",
          torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for M, N, K in ((129, 257, 200), (4096, 4096, 4096)):
            a = matrix(M, K, dtype, "cuda", "row", seed=1)
            b = matrix(K, N, dtype, "cuda", "col", seed=2)
            c = randn((N,), dtype, "cuda", seed=3)
            ref, allowed = bound(a, b, c, act="gelu_tanh", out_dtype=dtype)
            forms = {
                "addmm + gelu_tanh": F.gelu(torch.addmm(c, a, b), approximate="tanh"),
                "_addmm_activation": torch._addmm_activation(c, a, b, use_gelu=True),
                "_addmm_activation out=": torch._addmm_activation(c, a, b, use_gelu=True,
                                                                  out=torch.empty(M, N, dtype=dtype, device=dev)),
                "addmm (no act) vs its ref": torch.addmm(c, a, b),
            }
            for name, out in forms.items():
                if "no act" in name:
                    r, al = bound(a, b, c, out_dtype=dtype)
                    w = worst(out, r, al)
                else:
                    w = worst(out, ref, allowed)
                print(f"{str(dtype):15s} {M}x{N}x{K:<6d} {name:28s} err/allowed {w[0]:8.3f}  max rel {w[1]:.2e}")


if __name__ == "__main__":
    main()
