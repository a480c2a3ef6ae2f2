"""tunekit inside real PyTorch programs, on a GPU: the custom ops pass opcheck with the CUDA
candidates behind them, torch.compile (default and "reduce-overhead") runs the tuned ops, a model
step with every tunekit op is captured in a CUDA graph and replays correct results, and the patched
transformers models match torch on the GPU."""

import pytest
import torch
import torch.nn.functional as F

import tunekit
from tunekit.tunable import context, results_store, tuning
from tunekit.tunable.registry import get_op
from tunekit.tunable.session import TuningSession

pytestmark = pytest.mark.gpu

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _step(x, w):
    h = tunekit.silu(x @ w) + tunekit.gelu(x, approximate="tanh") + tunekit.gelu(x)
    return tunekit.logsumexp(h, -1) + tunekit.logsumexp(h, 0).sum()


def _reference(x, w):
    x, w = x.double(), w.double()
    h = F.silu(x @ w) + F.gelu(x, approximate="tanh") + F.gelu(x)
    return torch.logsumexp(h, -1) + torch.logsumexp(h, 0).sum()


@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck_every_custom_op_on_cuda(cuda, dtype):
    x = torch.randn(64, 40, device=cuda, dtype=dtype) * 3
    dy = torch.randn_like(x)
    lse = torch.logsumexp(x.float(), 1).to(dtype)
    cases = [
        (torch.ops.tunekit.silu.default, (x.requires_grad_(),)),
        (torch.ops.tunekit.silu_backward.default, (dy, x.detach())),
        (torch.ops.tunekit.gelu.default, (x, "tanh")),
        (torch.ops.tunekit.gelu.default, (x, "none")),
        (torch.ops.tunekit.gelu_backward.default, (dy, x.detach(), "none")),
        (torch.ops.tunekit.logsumexp.default, (x, [1], False)),
        (torch.ops.tunekit.logsumexp.default, (x, [0], True)),
        (torch.ops.tunekit.logsumexp_backward.default, (torch.randn_like(lse), x.detach(), lse, [1], False)),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compiled_step_runs_tunekit_ops_and_matches_float64(cuda, mode):
    torch._dynamo.reset()
    x = torch.randn(256, 128, device=cuda, dtype=torch.float16)
    w = torch.randn(128, 128, device=cuda, dtype=torch.float16) / 12
    compiled = torch.compile(_step, fullgraph=True, mode=mode)
    with tuning(results=":memory:", record_untuned=True):
        for _ in range(3):  # warm-up runs, then graph replays for reduce-overhead
            got = compiled(x, w)
        torch.cuda.synchronize()
        tuned = {e.op for e in results_store(":memory:").entries()}
        untuned = {u.op for u in results_store(":memory:").untuned()}
    if mode == "default":
        assert {"silu", "gelu", "logsumexp"} <= tuned, tuned  # tuned at run time by the compiled code
    else:  # Inductor's warm-up, then its capture, make the graph: nothing tuned, recorded for later tuning
        assert {"silu", "gelu", "logsumexp"} <= untuned and not tuned, (untuned, tuned)
    torch.testing.assert_close(got.double(), _reference(x, w), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("eager_first", [False, True])
@pytest.mark.parametrize("step_ms", [20.0, 0.3])
def test_no_tuning_session_works_in_inductors_cudagraph_warm_up(cuda, tmp_path, monkeypatch, step_ms, eager_first):
    """The warm-up before a reduce-overhead capture allocates from the graphs' pool; a session spread over
    calls kept tensors it made there, and the next compiled call raised "tensors in the cudagraph pool not
    tracked as outputs" (default step and a short one). Sessions neither start nor advance there: every
    advance runs on the default stream (the trees warm up and capture on a stream of their own)."""
    torch._dynamo.reset()
    x = torch.randn(512, 256, device=cuda, dtype=torch.float16)
    w = torch.randn(256, 256, device=cuda, dtype=torch.float16) / 16
    ops = [get_op(name) for name in ("silu", "gelu", "logsumexp")]
    on_default_stream, advance = [], TuningSession.advance

    def spied(session, step_ms):
        on_default_stream.append(torch.cuda.current_stream() == torch.cuda.default_stream())
        return advance(session, step_ms)
    monkeypatch.setattr(TuningSession, "advance", spied)
    compiled = torch.compile(_step, fullgraph=True, mode="reduce-overhead")
    with tuning(results=str(tmp_path / "results.sqlite"), tuning_step_ms=step_ms):
        cache_id = context.current().cache_id
        under_way = []
        if eager_first:
            _step(x, w)  # sessions start here, outside any graph
            under_way = [s for op in ops for key, s in op._sessions.items() if key[0] == cache_id]
            assert under_way or step_ms > 1  # a short step leaves sessions under way
        for _ in range(4):  # warm-up, capture, replays
            got = compiled(x, w)
        torch.cuda.synchronize()
        started = [key for op in ops for key, s in op._sessions.items() if key[0] == cache_id and s not in under_way]
        assert not started  # none started in the warm-up or the capture
        assert all(on_default_stream) and (on_default_stream or not eager_first or step_ms > 1)
        for op in ops:
            op.forget()
    torch.testing.assert_close(got.double(), _reference(x, w), rtol=2e-2, atol=2e-2)


def test_a_model_step_is_captured_in_a_cuda_graph_and_replays(cuda):
    x = torch.randn(512, 256, device=cuda, dtype=torch.bfloat16)
    w = torch.randn(256, 256, device=cuda, dtype=torch.bfloat16) / 16
    with tuning(results=":memory:", record_untuned=True):
        _step(x, w)  # eager: tunes every op for these signatures
        torch.cuda.synchronize()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            _step(x, w)  # warm-up on a side stream, as torch.cuda.graphs asks
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        small = torch.randn(7, 9, device=cuda, dtype=torch.bfloat16)  # a signature first met in capture
        with torch.cuda.graph(graph):
            out = _step(x, w)
            out_small = tunekit.silu(small)
        untuned = {u.op for u in results_store(":memory:").untuned()}
    assert "silu" in untuned  # the new signature ran the default and was recorded for later tuning
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        small.copy_(torch.randn_like(small))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out.double(), _reference(x, w), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(out_small, F.silu(small))


def test_patched_llama_matches_torch_on_the_gpu(cuda):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, vocab_size=256)
    model = transformers.LlamaForCausalLM(config).to(cuda)
    ids = torch.randint(0, 256, (2, 64), device=cuda)
    ref = model(ids, labels=ids)
    ref.loss.backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with tunekit.patch():
        got = model(ids, labels=ids)
        got.loss.backward()
    torch.testing.assert_close(got.logits, ref.logits, rtol=1e-4, atol=1e-4)
    for g, r in zip((p.grad for p in model.parameters()), ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-3, atol=1e-5)


def test_every_op_on_a_second_gpu_while_the_first_is_current():
    """Multi-GPU programs call ops on tensors of a device that is not the current one: every CUDA
    candidate must launch on the tensor's device and stream (its context), tuned or run directly."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    from tunekit.ops.gelu import GeluParams, gelu_op
    from tunekit.ops.logsumexp import LogsumexpParams, logsumexp_op
    from tunekit.ops.silu import SiluParams, silu_op

    torch.cuda.set_device(0)
    dev = torch.device("cuda", 1)
    x = torch.randn(3, 5000, device=dev, dtype=torch.float16) * 3
    ref = {"silu": F.silu(x.double()), "gelu": F.gelu(x.double()), "logsumexp": torch.logsumexp(x.double(), 1)}
    calls = {"silu": lambda: tunekit.silu(x), "gelu": lambda: tunekit.gelu(x), "logsumexp": lambda: tunekit.logsumexp(x, 1)}
    with tuning(results=":memory:", max_tuning_ms=30):
        for _ in range(2):  # tuned on the first call, the cached choice (the fast path) on the second
            for name, call in calls.items():
                value = call()
                torch.cuda.synchronize(dev)
                assert value.device == dev
                torch.testing.assert_close(value.double(), ref[name], rtol=2e-2, atol=2e-2, msg=name)
    ran = []
    for name, op, params in (("silu", silu_op, lambda: SiluParams(x)), ("gelu", gelu_op, lambda: GeluParams(x)),
                             ("logsumexp", logsumexp_op, lambda: LogsumexpParams(x, (1,)))):
        for c in op.candidates:
            p = params()
            if c.supports(p) is not None:
                continue
            out = c.run(p)
            torch.cuda.synchronize(dev)
            assert out.device == dev, c.name
            torch.testing.assert_close(out.double(), ref[name], rtol=2e-2, atol=2e-2, msg=c.name)
            ran.append(c.name)
    assert torch.cuda.current_device() == 0
    assert any("triton" in n for n in ran) and any(n.startswith("logsumexp_chunks") for n in ran), ran
