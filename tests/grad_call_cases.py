"""What tests/ops/test_grad_call*.py share: the activations' public calls beside torch's, with the name of
torch's backward node, and ways to decide or warm a signature."""

import importlib

import torch
import torch.nn.functional as F

import tunekit

silu_module = importlib.import_module("tunekit.ops.silu")
gelu_module = importlib.import_module("tunekit.ops.gelu.op")
lse_module = importlib.import_module("tunekit.ops.logsumexp.op")

CASES = {
    "silu": (lambda x: tunekit.silu(x), lambda x: F.silu(x), "SiluBackward0"),
    "gelu": (lambda x: tunekit.gelu(x), lambda x: F.gelu(x), "GeluBackward0"),
    "gelu_tanh": (lambda x: tunekit.gelu(x, approximate="tanh"), lambda x: F.gelu(x, approximate="tanh"),
                  "GeluBackward0"),
    "logsumexp": (lambda x: tunekit.logsumexp(x, -1), lambda x: torch.logsumexp(x, -1), "LogsumexpBackward0"),
}


def decide(op, params, choice: str) -> None:
    """Store ``choice`` as the decision for ``params``' signature (the tests' CPU has Triton's
    interpreter, whose candidates compete with torch's kernel when tuning)."""
    from tunekit.tunable import results_store, validators
    from tunekit.tunable.entries import CandidateRecord, Entry
    results_store().put(Entry(op=op.name, signature=params.signature(), device=validators.device_name(params.device),
                              choice=choice, complete=True, validators=validators.validators_for(params.device,
                                                                                                 op.candidates),
                              candidates={choice: CandidateRecord("chosen", 0.01)}, tuned_at=0.0, tuning_ms=1.0))


def warm(fn, shape=(37, 65), dtype=torch.float32):
    """Call twice on a tensor of this signature: the first tunes, the second has a runner cached."""
    for _ in range(2):
        fn(torch.randn(shape, dtype=dtype).requires_grad_())
