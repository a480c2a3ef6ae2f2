"""cuBLASLt's ranked algorithms as mm candidates (ops/gemm/cublaslt_candidates.py): each rank run
directly against a float64 reference (every dtype, row / column-major operands, odd and decode sizes,
misaligned bases, a given out, TF32 on and off, NaN / inf), what supports refuses and why, a side
stream, CUDA-graph capture, and tuning that may choose one."""

import pytest
import torch

import tunekit
from gemm_checks import DTYPES, check, matrix, nans
from tunekit.ops.gemm import GemmParams, mm_op
from tunekit.ops.gemm.op import challenger_floor
from tunekit.ops.gemm.cublaslt_candidates import CublasLtAlgorithm, cublaslt_candidates

RANKS = [c.name for c in cublaslt_candidates()]


def test_every_rank_is_a_candidate_of_mm_and_declines_cpu_tensors():
    for name in RANKS:
        c = mm_op.candidate(name)
        assert isinstance(c, CublasLtAlgorithm) and c.supports(GemmParams(torch.randn(4, 5), torch.randn(5, 3))) == \
            "CUDA only"


def _offered(c, p):
    why = c.supports(p)
    if why is not None and "offers" in why:
        pytest.skip(why)  # the heuristic ranks fewer algorithms for this problem
    assert why is None, why
    return c


@pytest.mark.gpu
@pytest.mark.parametrize("rank", range(len(RANKS)))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M, N, K, a_layout, b_layout", [
    (64, 48, 96, "row", "col"), (777, 155, 333, "row", "row"), (16, 512, 1024, "row", "col"),
    (1, 256, 4096, "row", "col"), (33, 65, 17, "col", "row"), (40, 24, 64, "misaligned", "col")])
def test_each_rank_directly(rank, dtype, M, N, K, a_layout, b_layout):
    a = matrix(M, K, dtype, "cuda", a_layout, seed=rank)
    b = matrix(K, N, dtype, "cuda", b_layout, seed=rank + 1)
    p = GemmParams(a, b, nans((M, N), dtype, "cuda"))
    c = _offered(CublasLtAlgorithm(rank), p)
    assert c.run(p) is p.out
    check(p.out, a, b, tf32=p.tf32)
    fresh = c.run(GemmParams(a, b))
    check(fresh, a, b, tf32=p.tf32)


@pytest.mark.gpu
@pytest.mark.parametrize("tf32", [False, True])
def test_float32_follows_torchs_tf32_switch(tf32):
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        a, b = matrix(96, 256, torch.float32, "cuda"), matrix(256, 80, torch.float32, "cuda", "col", seed=1)
        p = GemmParams(a, b)
        assert p.tf32 is tf32
        check(_offered(CublasLtAlgorithm(0), p).run(p), a, b, tf32=tf32)  # without TF32: float32's bound
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.gpu
def test_nan_and_inf_land_where_torchs_do():
    a, b = matrix(32, 64, torch.bfloat16, "cuda"), matrix(64, 40, torch.bfloat16, "cuda", seed=1)
    a[3, 5], a[7, 1], b[2, 9] = float("nan"), float("inf"), float("-inf")
    p = GemmParams(a, b)
    check(_offered(CublasLtAlgorithm(0), p).run(p), a, b)


@pytest.mark.gpu
def test_what_supports_refuses():
    a, b = matrix(32, 64, torch.bfloat16, "cuda"), matrix(64, 40, torch.bfloat16, "cuda", seed=1)
    c = CublasLtAlgorithm(0)
    assert "no epilogue" in c.supports(GemmParams(a, b, activation="gelu"))
    assert "dense" in c.supports(GemmParams(matrix(32, 64, torch.bfloat16, "cuda", "sliced"), b))
    assert "one dtype" in c.supports(GemmParams(a, b.float()))
    assert "empty" in c.supports(GemmParams(a[:, :0], b[:0]))
    assert "out" in c.supports(GemmParams(a, b, out=nans((40, 32), torch.bfloat16, "cuda").t()))
    assert "out" in c.supports(GemmParams(a, b, out=a[:, :40]))  # overlaps an operand
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert "deterministic" in c.supports(GemmParams(a, b))
    finally:
        torch.use_deterministic_algorithms(before)


@pytest.mark.gpu
def test_a_side_stream_and_a_cuda_graph():
    a, b = matrix(256, 512, torch.bfloat16, "cuda"), matrix(512, 384, torch.bfloat16, "cuda", "col", seed=1)
    p = GemmParams(a, b)
    c = _offered(CublasLtAlgorithm(0), p)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = c.run(p)
    torch.cuda.current_stream().wait_stream(side)
    check(y, a, b)
    c.run(p)  # the plan and this stream's workspace made outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        z = c.run(p)
    z.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check(z, a, b)


def _operands(M, N, K):
    """linear's operands as mm takes them: x [M, K], w.t() of w [N, K] (bfloat16, fixed seeds)."""
    return matrix(M, K, torch.bfloat16, "cuda"), matrix(N, K, torch.bfloat16, "cuda", seed=1)


def _tuned_linear(M, N, K):
    """tunekit.linear on fresh bf16 x [M, K] and w [N, K], tuned in this call (a fresh store): its
    result checked, the decision for its GEMM returned."""
    x, w = _operands(M, N, K)
    mm_op.forget()
    with tunekit.tuning(results=":memory:", max_tuning_ms=60000, tuning_step_ms=float("inf")):
        y = tunekit.linear(x, w)
        decision = mm_op.decision(GemmParams(x, w.t()))
    check(y, x, w.t())
    return decision


@pytest.mark.gpu
def test_tuning_times_the_ranks_and_the_public_call_stays_right():
    # ~90 us of cuBLAS: large enough that a challenger could save the GEMM floor (CHALLENGER_HOST_MS)
    decision = _tuned_linear(2048, 4096, 4096)
    assert decision is not None and decision.entry is not None and decision.entry.complete
    records = decision.entry.candidates
    assert records["cublaslt_h0"].status not in ("unsupported", "numerics", "skipped"), records["cublaslt_h0"]
    timed = [n for n in RANKS if n in records and records[n].time_ms is not None]
    assert timed, records  # the ranks were timed beside torch's kernel


@pytest.mark.gpu
def test_a_small_gemm_no_challenger_could_win_is_decided_without_timing_them():
    """512 x 768 x 1024 (~5 us): no candidate whose calls cost the host 10 us more than torch's (the
    cuBLASLt ranks among them) could save that, so none of them is compiled or timed; only candidates
    whose calls are planned (launch_plans.py: no floor beyond the margin) may be."""
    decision = _tuned_linear(512, 768, 1024)
    assert decision.entry.complete, decision
    records = decision.entry.candidates
    x, w = _operands(512, 768, 1024)
    floored = [n for n in records if n != "torch_mm" and challenger_floor(GemmParams(x, w.t()), mm_op.candidate(n)) > 0]
    assert "cublaslt_h0" in floored
    assert all(records[n].status in ("skipped", "unsupported") and records[n].time_ms is None for n in floored), records
    assert "cannot save 10.0 us" in records["cublaslt_h0"].reason
    assert decision.candidate.name not in floored


@pytest.mark.gpu
@pytest.mark.parametrize("eager_first", [False, True])
@pytest.mark.parametrize("fused", [False, True])
def test_a_cublaslt_choice_runs_under_reduce_overhead(eager_first, fused):
    """A cuBLASLt choice (the decider forces one) in a step compiled with ``mode="reduce-overhead"``: its
    workspace, made in Inductor's warm-up from the graphs' pool and kept, failed the trees' pool check on the
    next call (backends/cublaslt_graphs.py). Warm-up, capture and replays run and match float32."""
    from tunekit.ops.gemm import addmm_op
    from tunekit.tunable.tunable_op import Resolution, use_decider
    forced = {"mm": "cublaslt_h0", "addmm": "cublaslt_bias_h0"}
    chosen = []

    def decide(op, params, settings, signature, device, device_name):
        c = op.candidate(forced[op.name]) if op.name in forced else op.default
        c = c if c.supports(params) is None else op.default
        chosen.append(c.name)
        return Resolution(c, "the test forces it", signature, device_name)

    def step(x, w, b):
        return tunekit.linear_act(x, w, b, "gelu_tanh") if fused else tunekit.linear(x, w)

    torch._dynamo.reset()
    x, w = _operands(16, 1024, 4096)
    b = matrix(1, 1024, torch.bfloat16, "cuda", seed=2)[0]
    compiled = torch.compile(step, fullgraph=True, mode="reduce-overhead")
    before = use_decider(decide)
    mm_op.forget(), addmm_op.forget()
    try:
        with tunekit.tuning(results=":memory:"):
            if eager_first:
                step(x, w, b)  # the default stream's workspace, made outside any graph
            for _ in range(4):  # warm-up, capture, replays
                y = compiled(x, w, b)
            torch.cuda.synchronize()
    finally:
        use_decider(before)
        mm_op.forget(), addmm_op.forget()
    assert forced["addmm" if fused else "mm"] in chosen, chosen
    if fused:
        check(y, x, w.t(), act="gelu_tanh", bias=b)
    else:
        check(y, x, w.t())
