"""The GEMM family on a CUDA GPU, on the issue's shapes: every candidate forced on each (not only the
winner) against a float64 reference, TF32 when torch would use it, tuning end to end, CUDA-graph
capture of a tuned call, torch.compile with Inductor. Marked gpu: skipped without one.

Cost: the first run compiles every configuration for these shapes (a few minutes on a cold Triton
cache); the references are float64 GEMMs on the GPU (FP64 tensor cores on H100 / H200).
"""

import warnings

import pytest
import torch
import torch.nn.functional as F

import tunekit
from gemm_checks import bound, check, nans, randn, within
from tunekit.ops.gemm import AddmmParams, GemmParams, TritonGemm, addmm_op, mm_op

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

#: (name, M, N, K, B as a weight [N, K] transposed: linear's form)
SHAPES = [
    ("odd 4097x4095x4096", 4097, 4095, 4096, False),
    ("odd 777x1555x333", 777, 1555, 333, False),
    ("decode 16x4096x14336", 16, 4096, 14336, True),
    ("gpt2 head 128x50257x768", 128, 50257, 768, True),
]


def operands(M, N, K, weight, dtype, device="cuda"):
    a = randn((M, K), dtype, device)
    b = randn((N, K), dtype, device, seed=1).t() if weight else randn((K, N), dtype, device, seed=1)
    return a, b


def _out_of_resources(exc) -> bool:
    return type(exc).__name__ == "OutOfResources" or "out of resource" in str(exc).lower()


def run_all(op, p, ref, allowed):
    """Every candidate of ``op`` that can run ``p`` (pruning rules ignored), NaN-filled out each time.
    Returns (ran, skipped for shared memory)."""
    ran, skipped = [], []
    for c in op.candidates[1:]:
        if (c.cannot_run(p) if isinstance(c, TritonGemm) else c.supports(p)):  # cuBLASLt, torch's epilogue
            continue
        out = nans(p.out_shape(), p.a.dtype, p.a.device)
        try:
            result = c.run(p.replace(out=out))
            torch.cuda.synchronize()
        except Exception as exc:  # a configuration this GPU cannot hold (shared memory): tuning rejects it too
            if _out_of_resources(exc):
                skipped.append(c.name)
                continue
            raise
        assert result is out
        try:
            within(out, ref, allowed)
        except AssertionError as exc:
            raise AssertionError(f"{c.name}: {exc}") from None
        ran.append(c.name)
    if skipped:
        warnings.warn(f"{p.signature()}: out of shared memory: {', '.join(skipped)}")
    return ran, skipped


@pytest.mark.parametrize("name, M, N, K, weight", SHAPES, ids=[s[0] for s in SHAPES])
def test_every_candidate_on_issue_shapes(name, M, N, K, weight, cuda):
    a, b = operands(M, N, K, weight, torch.bfloat16)
    p = GemmParams(a, b)
    ref, allowed = bound(a, b)
    ran, _ = run_all(mm_op, p, ref, allowed)
    assert len(ran) >= 10, ran
    kinds = {n.split("_")[1] for n in ran}
    assert "matmul" in kinds
    if torch.cuda.get_device_capability() >= (9, 0):
        assert "tma" in kinds or "padded" in kinds


@pytest.mark.parametrize("dtype, tf32", [(torch.float16, False), (torch.float32, True), (torch.float32, False)],
                         ids=["f16", "f32-tf32", "f32-ieee"])
def test_every_candidate_in_other_dtypes(dtype, tf32, cuda):
    """fp16 and float32 (TF32 when torch would use it: allow_tf32 / precision "high") on an odd shape,
    with a bias + gelu epilogue (the addmm op)."""
    saved = torch._C._get_cublas_allow_tf32()
    torch._C._set_cublas_allow_tf32(tf32)
    try:
        for M, N, K in ((257, 1032, 520),):
            a, b = operands(M, N, K, True, dtype)
            bias = randn(N, dtype, "cuda", seed=2)
            p = AddmmParams(bias, a, b, activation="gelu")
            assert p.tf32 == (tf32 and dtype == torch.float32)
            ref, allowed = bound(a, b, bias, act="gelu", tf32=p.tf32)
            ran, _ = run_all(addmm_op, p, ref, allowed)
            assert len(ran) >= 8, ran
            if dtype == torch.float32:  # torch's own result meets the bound too (16-bit cuBLAS may reduce
                within(addmm_op.default.run(p), ref, allowed)  # split-K partials in 16 bits: not bounded here)
    finally:
        torch._C._set_cublas_allow_tf32(saved)


def test_batched_epilogue_and_in_place(cuda):
    batch, M, N, K = 4, 333, 520, 264
    a = randn((batch, M, K), torch.bfloat16, "cuda")
    b = randn((batch, K, N), torch.bfloat16, "cuda", seed=1)
    c = randn((batch, M, N), torch.bfloat16, "cuda", seed=2)
    p = AddmmParams(c, a, b, alpha=0.5, beta=-1.0, activation="silu")
    ref, allowed = bound(a, b, c, 0.5, -1.0, "silu")
    assert len(run_all(addmm_op, p, ref, allowed)[0]) >= 8
    ref, allowed = bound(a, b, c, 2.0, 0.5)
    first_of_kind = {}
    for cand in addmm_op.candidates[1:]:
        if isinstance(cand, TritonGemm):
            first_of_kind.setdefault(cand.kind, cand)
    for cand in first_of_kind.values():  # addmm_: out is C
        cc = c.clone()
        q = AddmmParams(cc, a, b, alpha=2, beta=0.5, out=cc)
        if cand.cannot_run(q) is None:
            assert cand.run(q) is cc
            within(cc, ref, allowed)


@pytest.mark.parametrize("M, N, K", [(4097, 4095, 4096), (1, 4096, 14336), (4096, 6144, 4096)])
def test_tuned_public_calls(M, N, K, cuda):
    """tunekit.linear / linear_act with tuning on (a fresh store): the tuned calls are right and the
    entry complete."""
    x, wt = operands(M, N, K, True, torch.bfloat16)
    w = wt.t()
    bias = randn(N, torch.bfloat16, "cuda", seed=2)
    with tunekit.tuning(results=":memory:", max_tuning_ms=60000, tuning_step_ms=float("inf")):
        for _ in range(2):
            check(tunekit.linear(x, w, bias), x, wt, bias)
            check(tunekit.linear_act(x, w, bias, "gelu_tanh"), x, wt, bias, act="gelu_tanh")
        e = tunekit.explain("addmm", bias, x, wt)
    assert e.complete, str(e)


def close_to(got, expected, rel):
    """Within ``rel`` of the largest magnitude (bf16 gradients through other kernels' roundings)."""
    err = (got.float() - expected.float()).abs().max()
    assert err <= rel * expected.float().abs().max(), (float(err), float(expected.float().abs().max()))


def test_training_step_and_patch(cuda):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1376), torch.nn.SiLU(), torch.nn.Linear(1376, 512, bias=False))
    model = model.cuda().bfloat16()
    x = randn((8, 64, 512), torch.bfloat16, "cuda")
    dy = randn((8, 64, 512), torch.float32, "cuda", seed=5)

    def step():
        model.zero_grad(set_to_none=True)
        y = model(x)
        (y.float() * dy).sum().backward()
        return y.detach(), [p.grad.clone() for p in model.parameters()]

    y, grads = step()
    with tunekit.tuning(results=":memory:", max_tuning_ms=30000, tuning_step_ms=float("inf")), tunekit.patch(["gemm"]):
        for _ in range(2):
            yp, gp = step()
    close_to(yp, y, 2e-2)
    for g, e in zip(gp, grads):
        close_to(g, e, 3e-2)


def test_cuda_graph_capture_of_tuned_calls(cuda):
    """A tuned call (whatever kernel won: TMA descriptors, padded copies, split-K workspace) replays
    correctly from a CUDA graph."""
    cases = [operands(4097, 4095, 1024, False, torch.bfloat16), operands(1, 4096, 14336, True, torch.bfloat16),
             operands(1024, 1024, 1024, True, torch.bfloat16)]
    with tunekit.tuning(results=":memory:", max_tuning_ms=30000, tuning_step_ms=float("inf")):
        for a, b in cases:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    tunekit.mm(a, b)  # tunes, then the tuned choice
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y = tunekit.mm(a, b)
            y.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            check(y, a, b)


def test_every_forced_kind_captures_in_a_graph(cuda):
    a, b = operands(1000, 1032, 520, False, torch.bfloat16)
    a_odd, b_odd = operands(1000, 1031, 520, False, torch.bfloat16)
    ref, allowed = bound(a, b)
    ref_odd, allowed_odd = bound(a_odd, b_odd)
    by_kind = {}
    for c in mm_op.candidates[1:]:
        by_kind.setdefault(getattr(c, "kind", "cublaslt"), c)
    for kind, c in by_kind.items():
        p = GemmParams(a_odd, b_odd) if kind == "padded" else GemmParams(a, b)
        if (c.cannot_run(p) if isinstance(c, TritonGemm) else c.supports(p)):
            continue
        c.run(p)  # compile (cuBLASLt: its plan and workspace) outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = c.run(p)
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        within(y, *((ref_odd, allowed_odd) if kind == "padded" else (ref, allowed)))


def test_compile_with_inductor_on_gpu(cuda):
    def f(x, w, bias):
        return tunekit.linear_act(x, w, bias, "silu")

    def leaves(seed):
        return [randn((4, 128, 512), torch.bfloat16, "cuda", seed).requires_grad_(),
                randn((1024, 512), torch.bfloat16, "cuda", seed + 1).requires_grad_(),
                randn(1024, torch.bfloat16, "cuda", seed + 2).requires_grad_()]

    ours, theirs = leaves(0), leaves(0)
    y = torch.compile(f, fullgraph=True)(*ours)
    ye = F.silu(F.linear(*theirs))
    close_to(y, ye, 2e-2)
    dy = randn(tuple(y.shape), torch.bfloat16, "cuda", seed=7)
    y.backward(dy)
    ye.backward(dy)
    for g, e in zip(ours, theirs):
        close_to(g.grad, e.grad, 3e-2)
    torch._dynamo.reset()
