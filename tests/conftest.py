"""Every test gets its own results file and in-memory choices, so no test sees another's tuning.
Without a GPU, Triton kernels run in Triton's interpreter.

Shipped pre-tuned results are off (``TUNEKIT_USE_SHIPPED=0``). Tests tune a new signature in its first call (``TUNEKIT_TUNING_STEP_MS=inf``): most of them are about
what tuning decides and stores, not about when. Tuning spread over calls, the default, has its own
tests (``tests/tunable/test_session.py``), which set the step they test."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton candidates run on CPU tensors in Triton's interpreter; it must be on before the kernels
    # module is imported (tunekit imports it lazily, at a Triton candidate's first use).
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tunekit.backends import fast_grad
from tunekit.ops.gemm import routes
from tunekit.tunable import context, registry, stores

# The GEMM family's C++ routes to torch's functions (tunekit/ops/gemm/routes.py) and the activations'
# C++ autograd nodes (tunekit/ops/_shared/grad_call.py) are built before any test runs (here if need
# be, ~15 s each once per machine), so which path a call takes never depends on when a background
# build finishes.
routes.ready()
fast_grad.load()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def isolated_results(tmp_path, monkeypatch):
    path = tmp_path / "results.sqlite"
    for var in context.ENV_VARS.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TUNEKIT_RESULTS", str(path))
    monkeypatch.setenv("TUNEKIT_TUNING_STEP_MS", "inf")
    # the results shipped for a GPU model would decide the signatures tests tune (tests/tunable/test_shipped.py
    # turns them on)
    monkeypatch.setenv("TUNEKIT_USE_SHIPPED", "0")
    context.reload_environment()
    for op in registry.all_ops():
        op.forget()
    yield path
    stores.close_all()
    for op in registry.all_ops():
        op.forget()
    monkeypatch.undo()
    context.reload_environment()


@pytest.fixture
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch.device("cuda")
