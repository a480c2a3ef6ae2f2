"""Triton activation kernels through TritonElementwise, against PyTorch in float64.

Without a GPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set here before the
kernels module is imported; the interpreter is slow, so sizes stay small). Outputs start as NaN so
an element the kernel never writes fails the comparison.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels module decorates its kernels

import tunekit  # noqa: E402
from tunekit.backends import triton as triton_backend  # noqa: E402
from tunekit.ops._shared.triton_elementwise import TritonElementwise  # noqa: E402
from tunekit.tunable.config import Config  # noqa: E402
from tunekit.tunable.numerics import compare, tolerance  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),  # numpy, interpreter
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

NAN, INF = float("nan"), float("inf")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(1,), (7,), (1003,), (4099,), (33, 17)]
SPECIALS = [NAN, INF, -INF, 20.0, -20.0, 100.0, -100.0, 0.0, -0.0]
aten = torch.ops.aten


class P:
    """Stand-in for an op's params: the tensors the candidate reads, ``out``, and gelu's ``approximate``."""

    def __init__(self, x, dy=None, out=None, approximate="none"):
        self.x, self.dy, self.out, self.approximate = x, dy, out, approximate


def gelu_constexprs(p):
    return {"TANH": p.approximate == "tanh"}


#: form id -> (kernel, inputs, approximate, float64 reference of (dy, x))
FORMS = {
    "silu_fwd": ("silu_forward_kernel", ("x",), "none", lambda dy, x: F.silu(x)),
    "silu_bwd": ("silu_backward_kernel", ("dy", "x"), "none", lambda dy, x: aten.silu_backward(dy, x)),
    "gelu_fwd_erf": ("gelu_forward_kernel", ("x",), "none", lambda dy, x: F.gelu(x)),
    "gelu_fwd_tanh": ("gelu_forward_kernel", ("x",), "tanh", lambda dy, x: F.gelu(x, approximate="tanh")),
    "gelu_bwd_erf": ("gelu_backward_kernel", ("dy", "x"), "none", lambda dy, x: aten.gelu_backward(dy, x)),
    "gelu_bwd_tanh": ("gelu_backward_kernel", ("dy", "x"), "tanh",
                      lambda dy, x: aten.gelu_backward(dy, x, approximate="tanh")),
}


def make(form, block=1024, num_warps=4):
    kernel, inputs, _, _ = FORMS[form]
    constexprs = gelu_constexprs if kernel.startswith("gelu") else None
    return TritonElementwise(f"triton_{form}", kernel, inputs, constexprs=constexprs,
                             config=Config(BLOCK=block, num_warps=num_warps))


def params(form, x, dy, out):
    return P(x, dy if "bwd" in form else None, out, FORMS[form][2])


def check(form, out, x, dy):
    """Within the dtype's tolerance (rtol x1.5) of the float64 result rounded to the dtype; NaN and
    infinities exactly where the reference has them."""
    expected = FORMS[form][3](dy.double(), x.double()).to(x.dtype)
    rtol, atol = tolerance(x.dtype)
    problem = compare(out, expected, (rtol * 1.5, atol))
    assert problem is None, f"{form} {x.dtype}: {problem}"


@pytest.fixture
def device():
    """cuda when there is one; else cpu, through the interpreter when the kernels were built for it."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and TRITON_INTERPRET is not 1")
    from tunekit.kernels.triton import activations

    if not triton_backend.interpreted(activations.silu_forward_kernel):
        pytest.skip("kernels module was imported before TRITON_INTERPRET=1 was set; they cannot run on CPU")
    return torch.device("cpu")


def randn(shape, dtype, device, scale=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype).to(device)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("form", FORMS)
def test_matches_float64(form, dtype, shape, device):
    x, dy = randn(shape, dtype, device), randn(shape, dtype, device, scale=1.0, seed=1)
    c = make(form)
    p = params(form, x, dy, torch.full_like(x, NAN))
    assert c.supports(p) is None
    out = c.run(p)
    assert out is p.out
    check(form, out, x, dy)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("form", FORMS)
def test_special_values(form, dtype, device):
    """nan, +-inf, +-20, +-100, +-0 in x (dy finite), then in dy (x moderate: with x = -100 even
    torch's own float32 gives dy=inf * sigmoid=0 = NaN where float64 still has a finite sigmoid)."""
    specials = torch.tensor(SPECIALS)
    n = len(SPECIALS)
    x = torch.cat([specials, randn(n, torch.float32, "cpu", seed=2)]).to(dtype).to(device)
    dy = torch.cat([randn(n, torch.float32, "cpu", scale=1.0, seed=3), specials]).to(dtype).to(device)
    c = make(form, block=8)  # several programs and a masked tail on 18 elements
    out = c.run(params(form, x, dy, torch.full_like(x, NAN)))
    check(form, out, x, dy)


@pytest.mark.parametrize("form", FORMS)
def test_in_place(form, device):
    x0, dy = randn(1003, torch.float16, device), randn(1003, torch.float16, device, scale=1.0, seed=1)
    x = x0.clone()
    assert make(form).run(params(form, x, dy, x)) is x
    check(form, x, x0, dy)
    if "bwd" in form:  # gradient written over dy
        d = dy.clone()
        assert make(form).run(params(form, x0, d, d)) is d
        check(form, d, x0, dy)


@pytest.mark.parametrize("form", ["silu_fwd", "gelu_bwd_tanh"])
def test_allocates_when_out_is_none(form, device):
    x, dy = randn((33, 17), torch.bfloat16, device), randn((33, 17), torch.bfloat16, device, seed=1)
    out = make(form, block=128, num_warps=2).run(params(form, x, dy, None))
    assert out.shape == x.shape and out.dtype == x.dtype and out.data_ptr() not in (x.data_ptr(), dy.data_ptr())
    check(form, out, x, dy)


class Boom:
    def __getitem__(self, grid):
        raise AssertionError("launched a kernel for an empty tensor")


@pytest.mark.parametrize("form", ["silu_fwd", "gelu_bwd_erf"])
def test_empty_launches_nothing(form, device):
    x = torch.empty(0, 5, device=device)
    c = make(form)
    assert c.supports(params(form, x, x, None)) is None
    c._kernel = Boom()
    out = torch.empty_like(x)
    assert c.run(params(form, x, x, out)) is out
    assert c.run(params(form, x, x, None)).shape == (0, 5)


def test_declines_non_contiguous(device):
    x = torch.randn(8, 8, device=device)
    c = make("silu_bwd")
    assert "contiguous" in c.supports(P(x[:, ::2], torch.randn(8, 4, device=device)))
    assert "contiguous" in c.supports(P(torch.randn(8, 4, device=device), x[:, ::2]))
    assert "contiguous" in c.supports(P(x, x, out=torch.empty(8, 8, device=device).t()))


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.int64])
def test_declines_other_dtypes(dtype, device):
    x = torch.ones(16, dtype=dtype, device=device)
    assert "float32, float16 or bfloat16" in make("gelu_fwd_erf").supports(P(x))


def test_declines_mixed_tensors(device):
    x = torch.randn(16, device=device)
    c = make("gelu_bwd_tanh")
    assert "dtype" in c.supports(P(x, x.half()))
    assert "dtype" in c.supports(P(x, x, out=x.half()))
    assert "shape" in c.supports(P(x, torch.randn(15, device=device)))
    assert "shape" in c.supports(P(x, x, out=torch.empty(4, 4, device=device)))


def test_declines_cpu_without_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert make("silu_fwd").supports(P(torch.randn(4))).startswith("needs a CUDA device")


def test_declines_cpu_when_kernels_were_compiled(device):
    if device.type != "cpu":
        pytest.skip("CPU tensors through the interpreter only")
    c = make("silu_fwd")
    c._kernel = object()  # what the module holds if it was imported before TRITON_INTERPRET=1
    assert "TRITON_INTERPRET" in c.supports(P(torch.randn(4)))


def test_missing_triton_is_a_reason(monkeypatch):
    monkeypatch.setattr(triton_backend, "kernel", lambda module, name: None)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert make("silu_fwd").supports(P(torch.randn(4))) == "needs triton (pip install 'tunekit[triton]')"


def test_source_hash_names_kernel_block_and_warps():
    base = make("silu_fwd").source_hash()
    assert base == make("silu_fwd").source_hash()
    assert base != make("gelu_fwd_erf").source_hash()
    assert base != make("silu_fwd", block=512).source_hash()
    assert base != make("silu_fwd", num_warps=8).source_hash()
    with pytest.raises(ValueError):
        make("silu_fwd", block=1000)


def test_import_does_not_load_triton():
    """``import tunekit`` and building a candidate (and its hash) leave triton unimported."""
    code = ("import sys, tunekit; from tunekit.ops._shared.triton_elementwise import TritonElementwise; "
            "TritonElementwise('t', 'silu_forward_kernel').source_hash(); "
            "assert 'triton' not in sys.modules, 'triton imported'")
    src = str(Path(tunekit.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("form", FORMS)
def test_large_on_gpu(form, dtype, cuda):
    n = 2**20 + 3
    x, dy = randn(n, dtype, cuda), randn(n, dtype, cuda, scale=1.0, seed=1)
    for block, warps in ((1024, 4), (256, 2), (4096, 8)):
        c = make(form, block=block, num_warps=warps)
        p = params(form, x, dy, torch.full_like(x, NAN))
        assert c.supports(p) is None
        out = c.run(p)
        torch.cuda.synchronize()
        check(form, out, x, dy)
