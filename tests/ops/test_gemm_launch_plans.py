"""Plans (``ops/gemm/launch_plans.py``): a call decided for a Triton kernel replayed from C++. On the CPU:
how recorded launches become slots, which calls are never planned, that a route holding a plan calls it
only for operands that ask for nothing beyond the kernels, and how learning stores plans. On a GPU
(``test_gemm_gpu.py``-style, marked): a planned call equals the candidate's own call for every kind."""

import time

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import tunekit
from tunekit.backends import triton_static
from tunekit.backends.fast_plan import SLOT_CONSTANT, SLOT_OPERAND, SLOT_RESULT, SLOT_SCRATCH, SLOT_TEMPORARY
from tunekit.ops.gemm import launch_plans, mm_op, routes
from tunekit.ops.gemm.cuda_decode import CONFIGS, GEMV_CONFIGS, CudaDecode, CudaGemv, decode_candidates
from tunekit.ops.gemm.params import GemmParams
from tunekit.ops.gemm.torch_candidates import torch_mm
from tunekit.ops.gemm.triton_candidates import triton_candidates
from tunekit.tunable import context
from tunekit.tunable.config import Config

needs_routes = pytest.mark.skipif(not routes.ready(), reason="the C++ GEMM routes could not be built here")


def test_recorded_launches_become_slots_by_address():
    x, w, bias = torch.randn(5, 7), torch.randn(3, 7), torch.randn(3)
    out, workspace = torch.empty(5, 3), torch.empty(2 * 5 * 3)
    first = (11, (4, 1, 1), 128, 512, 0, [x, w.t(), bias.expand(5, 3), None, workspace, 5, -1, True, 1.0])
    second = (12, (2, 1, 1), 64, 0, 256, [workspace, out, triton_static.SCRATCH, 0.5])
    temporaries, launches = launch_plans.slots_of([first, second], (x, w, bias), out)
    assert temporaries == (workspace.untyped_storage().nbytes(),)
    assert launches[0] == (11, 4, 1, 1, 128, 512, 0, (
        (SLOT_OPERAND, 0), (SLOT_OPERAND, 1), (SLOT_OPERAND, 2), (SLOT_CONSTANT, 0), (SLOT_TEMPORARY, 0),
        (SLOT_CONSTANT, 5), (SLOT_CONSTANT, (1 << 64) - 1), (SLOT_CONSTANT, 1), (SLOT_CONSTANT, 0x3F800000)))
    assert launches[1] == (12, 2, 1, 1, 64, 0, 256, (
        (SLOT_TEMPORARY, 0), (SLOT_RESULT, 0), (SLOT_SCRATCH, 0), (SLOT_CONSTANT, 0x3F000000)))


@pytest.mark.parametrize("stray", ["view", "type"])
def test_an_argument_no_slot_can_hold_leaves_the_call_unplanned(stray):
    x, out = torch.randn(4, 4), torch.empty(4, 4)
    buffer = torch.randn(64)
    value = buffer[8:] if stray == "view" else "text"  # a view into an unknown buffer: maybe data, not scratch
    assert launch_plans.slots_of([(1, (1, 1, 1), 32, 0, 0, [x, value, out])], (x,), out) is None


def test_only_triton_kinds_whose_launches_are_all_kept_kernels_are_plannable():
    kinds = {c.kind: launch_plans.plannable(c) for c in triton_candidates()}
    assert kinds == {"tma": True, "padded": False, "matmul": True, "skinny": True}
    assert not launch_plans.plannable(torch_mm)
    assert all(launch_plans.plannable(c) for c in decode_candidates())  # one launch into the result


def test_what_is_never_planned_says_why():
    a, b = torch.randn(5, 7), torch.randn(7, 3)
    y = a @ b
    matmul = next(c for c in triton_candidates() if c.kind == "matmul")
    padded = next(c for c in triton_candidates() if c.kind == "padded")
    refusal = launch_plans.refusal
    assert "kept kernels" in refusal(torch_mm, GemmParams(a, b), (a, b), y)
    assert "kept kernels" in refusal(padded, GemmParams(a, b), (a, b), y)  # its operand copies are torch's
    assert "not contiguous" in refusal(matmul, GemmParams(a, b), (a, b), y.t().contiguous().t())
    assert "out= given" in refusal(matmul, GemmParams(a, b, torch.empty(5, 3)), (a, b), y)
    square = torch.randn(6, 6)
    assert "share an address" in refusal(matmul, GemmParams(square, square.t()), (square, square), square @ square.t())
    x, w = torch.randn(2, 6, 7).transpose(0, 1), torch.randn(3, 7)  # leading dims that fold only by a copy
    copied = x.reshape(-1, 7)
    assert copied.data_ptr() != x.data_ptr()
    assert "not the call's operands" in refusal(matmul, GemmParams(copied, w.t()), (x, w, None), torch.empty(6, 2, 3))
    assert "not a CUDA result" in refusal(matmul, GemmParams(a, b), (a, b), y)  # this CPU: the rest holds


def test_decode_kernels_are_planned_without_kept_triton_launches(monkeypatch):
    """The CUDA C decode kernels need the plans' extension only; the Triton kinds need kept launches too."""
    from tunekit.backends import fast_plan
    monkeypatch.setattr(fast_plan, "unavailable_now", lambda: False)
    monkeypatch.setattr(triton_static, "enabled", lambda: False)
    assert launch_plans.possible(CudaGemv(*GEMV_CONFIGS[0])) and launch_plans.possible(CudaDecode(*CONFIGS[0]))
    assert not launch_plans.possible(triton_candidates()[0]) and not launch_plans.possible()
    monkeypatch.setattr(triton_static, "enabled", lambda: True)
    assert launch_plans.possible(triton_candidates()[0])
    monkeypatch.setattr(fast_plan, "unavailable_now", lambda: True)
    assert not launch_plans.possible(CudaGemv(*GEMV_CONFIGS[0]))


class _Recorder:
    """A plannable-looking candidate whose run records one launch reading ``extra`` (a fresh buffer)."""

    def __init__(self, split):
        self.config, self.extra = Config(SPLIT_K=split), torch.empty(64)

    def run(self, p):
        out = torch.empty(5, 3)
        triton_static._recording.launches.append((1, (1, 1, 1), 32, 0, 0, [p.a, p.b, out, self.extra]))
        return out


@pytest.mark.parametrize("split, planned", [(1, False), (2, True)])
def test_a_recorded_call_may_hold_a_temporary_only_with_split_k(split, planned):
    """A fresh buffer its launches read is the split-K workspace only; any other could be data a torch op
    (not recorded) was to fill: no plan."""
    a, b = torch.randn(5, 7), torch.randn(7, 3)
    made = launch_plans._record(_Recorder(split), GemmParams(a, b), (a, b), torch.empty(5, 3))
    assert (made is not None) is planned
    if planned:
        assert made[0] == (64 * 4,) and made[1][0][-1][3] == (SLOT_TEMPORARY, 0)


@needs_routes
def test_a_route_holding_a_plan_calls_it_for_plain_operands_only():
    x, w = torch.randn(5, 7), torch.randn(3, 7)
    key = routes.linear.key(x, w, None)
    answer = torch.full((5, 3), 7.0)
    calls = []

    def plan(*operands):
        calls.append(operands)
        return answer
    routes._routes.setdefault(context.current().cache_id, {})[key] = plan
    assert routes.linear(x, w, None) is answer and calls[0][0] is x and calls[0][2] is None
    assert tunekit.linear(x, w) is answer  # the public function asks the route first
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert routes.linear(x, w, None) is None
    with _Passthrough():
        assert routes.linear(x, w, None) is None
    with TorchFunctionMode():
        assert routes.linear(x, w, None) is None
    assert routes.linear(torch._neg_view(x), w, None) is None
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level():
        assert routes.linear(fwAD.make_dual(x, torch.ones_like(x)), w, None) is None
    assert len(calls) == 2


class _Passthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _Decided:
    """An op decided for ``candidate`` on every signature."""

    def __init__(self, candidate):
        self.default, self.candidate = torch_mm, candidate

    def decision(self, params, s):
        return type("R", (), {"candidate": self.candidate, "entry": None})()


@needs_routes
@pytest.mark.parametrize("made, stored", [("plan", "plan"), ("none", False), ("later", None)])
def test_learning_keeps_a_plan_refuses_the_key_or_waits_for_the_extension(monkeypatch, made, stored):
    x, w = torch.randn(5, 7), torch.randn(3, 7)
    y = F.linear(x, w)
    triton = next(c for c in triton_candidates() if c.kind == "matmul")
    plan = object()
    answer = {"plan": plan, "none": None, "later": launch_plans.LATER}[made]
    asked = []
    monkeypatch.setattr(launch_plans, "make", lambda *args: asked.append(args) or answer)
    routes.learn(routes.linear, (x, w, None), lambda: [(_Decided(triton), GemmParams(x, w.t()))], y)
    key = routes.linear.key(x, w, None)
    table = routes.routed_keys()
    assert asked and asked[0][0] is triton and asked[0][2] == (x, w, None) and asked[0][3] is y
    if stored is None:
        assert key not in table and not routes._looked  # asked again on the next call
    else:
        assert table == {key: plan if stored == "plan" else False}


@needs_routes
def test_a_call_whose_bias_alone_requires_grad_is_never_planned(monkeypatch):
    """Its products hold no backward GEMM, yet autograd records it: a plan (no autograd node) would lose
    the bias's gradient. Learning refuses the key, and a plan found in the table anyway is not called."""
    x, w, b = torch.randn(5, 7), torch.randn(3, 7), torch.randn(3, requires_grad=True)
    triton = next(c for c in triton_candidates() if c.kind == "matmul")
    asked = []
    monkeypatch.setattr(launch_plans, "make", lambda *args: asked.append(args))
    y = F.linear(x, w, b)
    assert len(routes.products(b, x, w, y, weight=True)) == 1  # no backward GEMM: only the bias needs a gradient
    routes.learn(routes.linear, (x, w, b), lambda: [(_Decided(triton), None)], y)
    assert asked == []
    assert list(routes.routed_keys().values()) == [False]
    key = routes.linear.key(x, w, b)
    routes._routes[context.current().cache_id][key] = lambda *operands: torch.zeros(5, 3)
    assert routes.linear(x, w, b) is None  # the C++ guard: an operand requires grad under grad mode


@needs_routes
def test_a_call_autograd_records_is_never_planned(monkeypatch):
    x, w = torch.randn(5, 7, requires_grad=True), torch.randn(3, 7)
    triton = next(c for c in triton_candidates() if c.kind == "matmul")
    asked = []
    monkeypatch.setattr(launch_plans, "make", lambda *args: asked.append(args))
    decided = _Decided(triton)
    routes.learn(routes.linear, (x, w, None), lambda: [(decided, None), (decided, None)], F.linear(x, w))
    assert asked == [] and list(routes.routed_keys().values()) == [False]


gpu = pytest.mark.gpu


def _kinds_and_shapes():
    """(candidate, M, N, K, linear?) that each exercise one path: pointer tiles on odd sizes, split-K (a
    workspace and a second launch), the skinny decode kernel (split too), the persistent TMA kernel (scratch
    for its device-side descriptors), a mm of row-major operands, the wrapped kinds (sizes at run time
    and as constants), the turned-over decode kind (operands launched as transposed views: linear's layout
    and a row-major b) and the CUDA C decode kernels, MMA and one-row (a launch recorded by record_launch)."""
    from tunekit.ops.gemm.triton_swapped import swapped_candidates
    from tunekit.ops.gemm.triton_wrapped import wrapped_candidates
    by = {c.name: c for c in [*triton_candidates(), *wrapped_candidates(), *swapped_candidates()]}
    return [(by["triton_matmul_m128_n128_k32_g8_sk1_w4_s4"], 777, 1555, 333, True),
            (by["triton_matmul_m16_n64_k128_g8_sk4_w4_s4"], 16, 4096, 4096, True),
            (by["triton_skinny_m1_n16_k512_g1_sk2_w4_s1"], 1, 4096, 4096, True),
            (by["triton_tma_m128_n256_k64_g8_sk1_w8_s3"], 512, 1024, 512, True),
            (by["triton_matmul_m64_n64_k64_g8_sk1_w4_s3"], 300, 200, 100, False),
            (by["triton_wrapped_m64_n128_k32_g8_sk1_w8_s4"], 777, 1555, 333, True),
            (by["triton_wrapped_static_m64_n128_k32_g8_sk1_w8_s4"], 777, 1555, 333, True),
            (by["triton_swapped_m64_n16_k128_g1_sk1_w4_s8"], 16, 4096, 4096, True),
            (by["triton_swapped_m64_n16_k128_g1_sk1_w4_s4"], 5, 1000, 4104, False),
            (CudaDecode(*CONFIGS[0]), 3, 1000, 4104, True), (CudaGemv(*GEMV_CONFIGS[0]), 1, 1000, 4104, True)]


@gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("candidate, M, N, K, linear", _kinds_and_shapes(),
                         ids=lambda v: getattr(v, "name", str(v)))
def test_a_planned_call_is_the_candidates_own_call(candidate, M, N, K, linear):
    assert routes.ready() and triton_static.enabled()
    torch.manual_seed(0)
    a = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(N, K, dtype=torch.bfloat16, device="cuda")
    b = w.t() if linear else torch.randn(K, N, dtype=torch.bfloat16, device="cuda")
    p = GemmParams(a, b)
    assert getattr(candidate, "cannot_run", candidate.supports)(p) is None
    expected = candidate.run(p)  # compiles and keeps its kernels
    operands = (a, w, None) if linear else (a, b)
    plan = None
    for _ in range(200):  # the plans' extension builds on its worker at the first ask
        plan = launch_plans.make(candidate, p, operands, expected)
        if plan is not launch_plans.LATER:
            break
        time.sleep(0.1)
    assert plan is not None and plan is not launch_plans.LATER
    for _ in range(2):  # fresh operands of the same layout: the plan patches their pointers
        a2, w2 = torch.randn_like(a), torch.randn_like(w)
        b2 = w2.t() if linear else torch.randn_like(b)
        got = plan(*((a2, w2, None) if linear else (a2, b2)))
        want = candidate.run(GemmParams(a2, b2))
        torch.cuda.synchronize()
        assert got.shape == want.shape and torch.equal(got, want)
