"""tunekit.patch: patched torch calls go through tunekit with torch's results and gradients; every
other call form reaches torch unchanged (tests/test_patch_undo.py: undo restores the exact original objects)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch._dynamo  # imported before any patch here: see the subprocess test for the other order
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F

import tunekit
from tunekit.backends import fast_grad
from tunekit.ops._shared import routing as _routing

from patch_checks import (DTYPES, TENSOR_LOGSUMEXP, TORCH_GELU, TORCH_LOGSUMEXP, TORCH_SILU,  # noqa: F401
                          assert_torch_untouched, close, float64_refs, patched_ops, rand, runs, torch_as_it_was)


# -- routing: patched calls go through tunekit, with torch's results --------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_patched_entry_point_runs_tunekit_exactly_once(dtype, runs):
    x = rand((37, 70), dtype)
    calls = [  # (the call, the op that must run once, the float64 reference)
        (lambda: F.silu(x), "silu", "silu"),
        (lambda: F.silu(input=x, inplace=False), "silu", "silu"),
        (lambda: torch.nn.SiLU()(x), "silu", "silu"),
        (lambda: F.gelu(x), "gelu", "gelu"),
        (lambda: F.gelu(x, approximate="tanh"), "gelu", "gelu_tanh"),
        (lambda: torch.nn.GELU("tanh")(x), "gelu", "gelu_tanh"),
        (lambda: torch.nn.GELU()(x), "gelu", "gelu"),
        (lambda: torch.logsumexp(x, 1), "logsumexp", "lse1"),
        (lambda: torch.logsumexp(input=x, dim=[0, 1], keepdim=True), "logsumexp", "lse01"),
        (lambda: x.logsumexp(1), "logsumexp", "lse1"),
        (lambda: x.logsumexp(dim=(-2, -1), keepdim=True), "logsumexp", "lse01"),
    ]
    refs = float64_refs(x)
    with tunekit.tuning(tuning=False), tunekit.patch():
        for call, op, ref in calls:
            before = runs.counts()
            y = call()
            after = runs.counts()
            assert after[op] == before[op] + 1 and sum(after.values()) == sum(before.values()) + 1, (op, ref)
            assert y.dtype == dtype
            close(y, refs[ref].to(dtype), dtype, op)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tuned_patched_calls_match_torch(dtype, runs):
    """Tuning on (the default): whichever candidate wins, the results are torch's within tolerance."""
    x = rand((65, 129), dtype)
    with tunekit.patch():
        got = {"silu": F.silu(x), "gelu": F.gelu(x), "gelu_tanh": torch.nn.GELU("tanh")(x), "lse1": x.logsumexp(1)}
    want = {"silu": TORCH_SILU(x), "gelu": TORCH_GELU(x), "gelu_tanh": TORCH_GELU(x, approximate="tanh"),
            "lse1": TORCH_LOGSUMEXP(x, 1)}
    for key in got:
        close(got[key], want[key], dtype, "gelu" if key.startswith("gelu") else key)
    assert runs.count("silu") and runs.count("gelu") and runs.count("logsumexp")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("which", ["silu", "gelu", "gelu_tanh", "logsumexp"])
def test_gradients_through_patched_functions(which, dtype, runs):
    """silu / gelu: tunekit's forward with torch's own node (ops/_shared/grad_call.py; conftest builds
    it); logsumexp above TORCH_NODE_MAX_NUMEL: tunekit's tuned gradient."""
    fn = {"silu": lambda t: F.silu(t), "gelu": lambda t: F.gelu(t),  # looked up at call time: patched
          "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "logsumexp": lambda t: torch.logsumexp(t, -1)}[which]
    backward_op = {"gelu_tanh": "gelu"}.get(which, which) + "_backward"
    # logsumexp's tuned gradient runs above TORCH_NODE_MAX_NUMEL elements (below it, torch's node)
    x = rand((40, 1700) if which == "logsumexp" else (40, 96), dtype, requires_grad=True)
    y_torch = fn(x)  # not patched yet: torch's forward and autograd
    dy = torch.randn_like(y_torch)
    (dx_torch,) = torch.autograd.grad(y_torch, x, dy)
    with tunekit.tuning(tuning=False), tunekit.patch():
        y = fn(x)
        assert y.grad_fn is not None and runs.count(backward_op) == 0
        (dx,) = torch.autograd.grad(y, x, dy)
    torch_node = which != "logsumexp" and fast_grad.load() is not None
    assert runs.count(backward_op) == (0 if torch_node else 1)
    op = "gelu" if which.startswith("gelu") else which
    close(y, y_torch, dtype, op)
    close(dx, dx_torch, dtype, op)


def test_in_place_forms_write_into_the_input(runs):
    x = rand((31, 17), torch.float32)
    want_silu = TORCH_SILU(x)
    with tunekit.tuning(tuning=False), tunekit.patch():
        a = x.clone()
        assert F.silu(a, inplace=True) is a  # as torch: the input itself comes back
        b = x.clone()
        out = torch.nn.SiLU(inplace=True)(b)
        assert out.data_ptr() == b.data_ptr()
    assert runs.count("silu") == 2
    torch.testing.assert_close(a, want_silu, rtol=0, atol=0)
    torch.testing.assert_close(b, want_silu, rtol=0, atol=0)


def test_only_the_selected_ops_are_patched(runs):
    x = rand((8, 9), torch.float32)
    with tunekit.tuning(tuning=False), tunekit.patch(["silu"]) as handle:
        assert patched_ops() == {"silu"} and handle.ops == ("silu",)
        assert F.gelu is TORCH_GELU and torch.logsumexp is TORCH_LOGSUMEXP
        F.silu(x), F.gelu(x), torch.logsumexp(x, 0)
        assert runs.counts()["silu"] == 1 and runs.total() == 1
    with tunekit.patch("logsumexp"):
        assert patched_ops() == {"logsumexp"}
    with tunekit.patch(("gelu", "logsumexp", "gelu")) as handle:
        assert patched_ops() == {"gelu", "logsumexp"} and handle.ops == ("gelu", "logsumexp")


def test_unknown_op_is_refused_and_patches_nothing():
    with pytest.raises(ValueError, match="unknown op 'softmax'"):
        tunekit.patch(["silu", "softmax"])
    assert_torch_untouched()


# -- fallbacks: what tunekit does not take reaches torch, unchanged -----------------------------
class Subclass(torch.Tensor):
    pass


class Logged:
    """A non-tensor with __torch_function__: torch hands the call to it."""

    def __init__(self, t):
        self.t, self.seen = t, []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        self = next(a for a in args if isinstance(a, Logged))
        self.seen.append(func)
        return "handled"


def test_argument_forms_tunekit_does_not_take_go_to_torch_unchanged(runs):
    x = rand((6, 7), torch.float32)
    ints = torch.randint(-5, 5, (6, 7))
    sub = x.as_subclass(Subclass)
    want = {"ints": TORCH_LOGSUMEXP(ints, 1), "sub_silu": TORCH_SILU(sub),
            "sub_lse": TENSOR_LOGSUMEXP(sub, 0), "f64": TORCH_SILU(x.double())}
    logged = Logged(x)
    with tunekit.patch():
        assert torch.equal(torch.logsumexp(ints, 1), want["ints"])  # torch promotes integers
        got_sub = F.silu(sub)
        assert type(got_sub) is Subclass and torch.equal(got_sub, want["sub_silu"])
        got_sub_lse = sub.logsumexp(0)
        assert type(got_sub_lse) is Subclass and torch.equal(got_sub_lse, want["sub_lse"])
        assert F.gelu(logged) == "handled" and torch.logsumexp(logged, 0) == "handled"
        assert runs.total() == 0, runs.counts()
        assert torch.equal(F.silu(x.double()), want["f64"]) and runs.count("silu") >= 1  # float64: tunekit (tunes)


def test_torchs_argument_forms_are_routed_as_torch_binds_them(runs):
    """Positional ``inplace``, ``input=`` and ``out=`` keywords: the forms torch accepts reach tunekit
    (one candidate run each, tuning off) with torch's results; ``out=`` returns ``out`` itself."""
    x = rand((6, 7), torch.float32)
    refs = float64_refs(x)
    with tunekit.tuning(tuning=False), tunekit.patch():
        calls = [
            ("silu", "silu", lambda: F.silu(x.clone(), True)),
            ("silu", "silu", lambda: F.silu(input=x.clone(), inplace=True)),
            ("silu", "silu", lambda: F.silu(input=x)),
            ("gelu", "gelu", lambda: F.gelu(input=x)),
            ("gelu", "gelu_tanh", lambda: F.gelu(x, approximate="tanh", out=torch.full_like(x, float("nan")))),
            ("logsumexp", "lse1", lambda: torch.logsumexp(x, 1, False, out=torch.full((6,), float("nan")))),
            ("logsumexp", "lse1", lambda: torch.logsumexp(input=x, dim=(1,), out=torch.full((6,), float("nan")))),
        ]
        for op, ref, call in calls:
            before = runs.count(op)
            close(call(), refs[ref].float(), torch.float32, op)
            assert runs.count(op) == before + 1, (op, ref)
        out = torch.full((6,), float("nan"))
        assert torch.logsumexp(x, 1, out=out) is out


@pytest.mark.parametrize("call", [
    lambda x: torch.logsumexp(x, 1, out=torch.empty(5)),                   # torch resizes, with a warning
    lambda x: torch.logsumexp(x, 1, out=torch.empty(6, dtype=torch.float64)),  # torch casts
    lambda x: torch.logsumexp(x, 1, out=torch.empty(1).expand(6)),          # torch refuses
    lambda x: F.gelu(x, out=torch.empty(3)),
    lambda x: F.gelu(x, out=x[:, :3]),
], ids=["lse-resized", "lse-float64-out", "lse-expanded-out", "gelu-resized", "gelu-overlapping"])
def test_out_forms_tunekit_cannot_write_are_torchs(call):
    from elementwise_checks import assert_same_outcome, outcome
    x = rand((6, 7), torch.float32)
    theirs = outcome(call, x.clone())
    with tunekit.patch():
        ours = outcome(call, x.clone())
    assert_same_outcome(ours, theirs, what="patched")


@pytest.mark.parametrize("call", [
    lambda x, ints: F.silu(ints),                      # integer dtype
    lambda x, ints: F.gelu(x, "tanh"),                 # approximate is keyword-only in torch
    lambda x, ints: F.gelu(x, approximate="sigmoid"),
    lambda x, ints: torch.logsumexp(x, ()),            # an empty dim tuple
    lambda x, ints: F.silu(x, inplace=True, out=x),
    lambda x, ints: torch.logsumexp(x, "W"),           # a dim name (named tensors: gone from torch 2.13)
    lambda x, ints: x.logsumexp(5),
], ids=["int", "positional-approximate", "bad-approximate", "empty-dim", "unknown-kw", "dim-name",
        "dim-range"])
def test_calls_torch_refuses_raise_torch_errors(call, runs):
    x, ints = rand((6, 7), torch.float32), torch.randint(-5, 5, (6, 7))
    with pytest.raises(Exception) as from_torch:
        call(x.clone(), ints)
    with tunekit.patch(), pytest.raises(from_torch.type) as patched:
        call(x.clone(), ints)
    assert str(patched.value) == str(from_torch.value)
    assert runs.total() == 0


class RecordingMode(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(getattr(func, "__name__", func))
        return func(*args, **(kwargs or {}))


def test_traces_transforms_and_modes_get_torch_ops(runs):
    x = rand((5, 8), torch.float32)
    tangent = torch.randn_like(x)
    want = TORCH_SILU(x)
    _, want_jvp = torch.func.jvp(TORCH_SILU, (x,), (tangent,))
    with tunekit.patch():
        assert torch.equal(torch.func.vmap(F.silu)(x), want)
        _, got_jvp = torch.func.jvp(F.silu, (x,), (tangent,))
        assert torch.equal(got_jvp, want_jvp)
        with fwAD.dual_level():
            y = F.silu(fwAD.make_dual(x, tangent))
            assert torch.equal(fwAD.unpack_dual(y).tangent, want_jvp)
        traced = torch.jit.trace(torch.nn.Sequential(torch.nn.SiLU(), torch.nn.GELU()), x, check_trace=False)
        assert {"aten::silu", "aten::gelu"} <= {n.kind() for n in traced.inlined_graph.nodes()}
        # fullgraph: the replacements trace without a break; aot_eager: the graph is aten ops, run as such
        # (the "eager" backend's Python code looks torch.logsumexp up again when it runs: patched then)
        compiled = torch.compile(lambda t: F.silu(t) + torch.logsumexp(t, 1, keepdim=True), backend="aot_eager",
                                 fullgraph=True)
        torch.testing.assert_close(compiled(x), want + TORCH_LOGSUMEXP(x, 1, keepdim=True))
        assert runs.total() == 0, runs.counts()
        mode = RecordingMode()
        with mode:  # the mode sees the call (what it then runs is its own business) and torch's result
            assert torch.equal(F.silu(x), want) and torch.equal(torch.logsumexp(x, 0), TORCH_LOGSUMEXP(x, 0))
        assert "silu" in mode.seen and "logsumexp" in mode.seen
        with torch.autocast("cpu", dtype=torch.bfloat16):
            before = runs.counts()
            assert torch.equal(torch.logsumexp(x, 1), TORCH_LOGSUMEXP(x, 1))
            assert runs.count("logsumexp") == before["logsumexp"]  # logsumexp under autocast is torch's
            assert F.silu(x).dtype == torch.float32 and runs.count("silu") > before["silu"]  # no autocast rule


def test_compile_after_undo_works_when_dynamo_was_first_imported_while_patched():
    """dynamo builds its tables of torch functions when imported; imported while patched, they hold the
    replacements. Undo must drop them, or torch.compile refuses torch.logsumexp afterwards."""
    script = textwrap.dedent("""
        import sys, torch, torch.nn.functional as F, tunekit
        assert "torch._dynamo" not in sys.modules
        f = lambda t: F.silu(t) + torch.logsumexp(t, 1, keepdim=True) + t.logsumexp(0)
        x = torch.randn(5, 8)
        with tunekit.patch():
            torch.testing.assert_close(torch.compile(f, backend="eager", fullgraph=True)(x), f(x))
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(f, backend="eager", fullgraph=True)(x), f(x))
        print("ok")
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(tunekit.__file__).parents[1])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_calls_from_inside_tunekit_reach_torch_not_the_patch(runs):
    """tunekit's default candidates call torch.logsumexp and F.silu(inplace=True): while patched, those
    must reach torch, or they would recurse; the guard is down again after an error."""
    x = rand((9, 33), torch.float32)
    leaf = rand((4, 4), torch.float32, requires_grad=True)
    with tunekit.patch():
        torch.testing.assert_close(torch.logsumexp(x, 1), TORCH_LOGSUMEXP(x, 1))  # tunes, runs torch_logsumexp
        a = x.clone()
        F.silu(a, inplace=True)
        torch.testing.assert_close(a, TORCH_SILU(x))
        with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
            F.silu(leaf, inplace=True)  # torch's own error, from inside tunekit
        assert not _routing.inside_tunekit()
        before = runs.count("silu")
        F.silu(x)
        assert runs.count("silu") > before
