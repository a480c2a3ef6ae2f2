"""rms_norm's drop-in use: ``tunekit.nn.RMSNorm`` and the ``tunekit.patch()`` replacements of
``F.rms_norm``, ``nn.RMSNorm.forward`` and the RMSNorm modules of Hugging Face's LLaMA-family models.

Hugging Face's modules (``LlamaRMSNorm`` and the copies of it in Mistral, Qwen2, Qwen3) compute
``weight * (x.float() * rsqrt(mean(x.float()^2) + eps)).to(x.dtype)`` in seven eager ops and as
many autograd nodes: in a LLaMA-style training step on an H200 their host time made the step 1.28x
slower than with torch's fused ``F.rms_norm`` (``benchmarks/results/model_step-*``). Their result
is rms_norm's with one rounding less (the normalized value is not rounded to 16 bits before the
weight multiplies it): within one unit in the last place. Calls whose weight has another dtype than
the input (then Hugging Face's result is float32) keep the module's own forward.
"""

from __future__ import annotations

import torch

from .op import rms_norm
from .._shared import routing

__all__ = ["RMSNorm", "routed_rms_norm", "patched_functional", "patched_forward", "patched_hf_forward",
           "HF_RMS_NORMS"]

#: Hugging Face modules whose forward is LlamaRMSNorm's ("Copied from" it in transformers' sources)
HF_RMS_NORMS = tuple(f"transformers.models.{m}.modeling_{m}:{c}RMSNorm"
                     for m, c in (("llama", "Llama"), ("mistral", "Mistral"), ("qwen2", "Qwen2"), ("qwen3", "Qwen3")))


def routed_rms_norm(x, normalized_shape, weight, eps):
    """:func:`rms_norm` for a call routed from torch's entry points (after ``routing.takes(x)``), with
    the "inside tunekit" flag set so the torch functions tunekit calls reach torch while patched."""
    state = routing.state
    state.inside = True
    try:
        return rms_norm(x, normalized_shape, weight, eps)
    finally:
        state.inside = False


class RMSNorm(torch.nn.RMSNorm):
    """``torch.nn.RMSNorm`` whose forward runs :func:`tunekit.rms_norm` for the inputs where tunekit
    gives torch's results (``ops/_shared/routing.py``); torch's own forward for any other."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if routing.takes(x):
            return routed_rms_norm(x, self.normalized_shape, self.weight, self.eps)
        return super().forward(x)


def patched_functional(attr):
    def rms_norm(*args, **kwargs):
        if attr.users:
            bound = routing.bind(args, kwargs, ("input", "normalized_shape", "weight", "eps"),
                                 defaults={"weight": None, "eps": None})
            if bound is not None and routing.takes(bound["input"]):
                return routed_rms_norm(bound["input"], bound["normalized_shape"], bound["weight"], bound["eps"])
        return attr.original(*args, **kwargs)
    return rms_norm


def patched_forward(attr):
    def forward(self, *args, **kwargs):
        if attr.users and len(args) == 1 and not kwargs and routing.takes(args[0]):
            return routed_rms_norm(args[0], self.normalized_shape, self.weight, self.eps)
        return attr.original(self, *args, **kwargs)
    return forward


def patched_hf_forward(attr):
    def forward(self, *args, **kwargs):
        if attr.users and len(args) == 1 and not kwargs:
            x, weight = args[0], getattr(self, "weight", None)
            eps = getattr(self, "variance_epsilon", None)
            if (routing.takes(x) and isinstance(weight, torch.Tensor) and weight.dtype == x.dtype
                    and weight.dim() == 1 and type(eps) is float):
                return routed_rms_norm(x, (weight.shape[0],), weight, eps)
        return attr.original(self, *args, **kwargs)
    return forward
