"""Real models under tunekit.patch: Hugging Face transformers' LLaMA and GPT-2, tiny configs with random
weights (nothing downloaded), forward and backward with and without the patch.

What transformers' activations call (transformers/activations.py, checked on 5.23):

- ``hidden_act="silu"`` (LLaMA): ``SiLUActivation.forward`` calls ``nn.functional.silu(input)``, looked
  up at every call, so the patch reaches models built before it too.
- ``activation_function="gelu"``: ``GELUActivation.__init__`` stores ``self.act = nn.functional.gelu``;
  ``"gelu_pytorch_tanh"``: ``GELUTanh.__init__`` stores ``functools.partial(nn.functional.gelu,
  approximate="tanh")``. Both take the function when the model is built: build the model while the
  patch is active (the test below shows that a model built before keeps torch's gelu). GPT-2's
  default ``"gelu_new"`` is a Python formula (tanh, pow) that calls no gelu at all.

Tolerances (float32, CPU): with tuning off the default candidates run, which are torch's own kernels
forward and backward, so outputs and gradients are bit-identical. With tuning on, any candidate that
passed tunekit's numerical check may run: per element within rtol 2e-5 + atol 1e-6 of torch's kernel
(gelu: atol 8e-6); forcing silu's ``x * sigmoid(x)`` candidate in the LLaMA model moved the logits by at
most 1.5e-7 and the gradients by at most 5e-7 of their largest value. ``rtol=1e-4, atol=1e-5`` per
element leaves room for other candidates and machines without hiding a wrong kernel (one wrong
activation element in 256 moves the gradients by far more).
"""

import copy

import pytest
import torch

import tunekit
from op_spies import CandidateRuns
from tunekit.backends import fast_grad

transformers = pytest.importorskip("transformers")

RTOL, ATOL = 1e-4, 1e-5
LAYERS, VOCAB, BATCH, SEQ = 2, 128, 2, 24


def llama(hidden_act="silu"):
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=LAYERS,
                                      num_attention_heads=4, num_key_value_heads=4, vocab_size=VOCAB,
                                      max_position_embeddings=64, hidden_act=hidden_act)
    return transformers.LlamaForCausalLM(config)


def gpt2(activation_function):
    config = transformers.GPT2Config(n_embd=64, n_layer=LAYERS, n_head=4, vocab_size=VOCAB, n_positions=64,
                                     activation_function=activation_function, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def step(model, ids):
    """Forward and backward of the language-model loss: (logits, loss, {parameter: gradient})."""
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return out.logits.detach(), out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def assert_same_step(patched, reference, rtol=RTOL, atol=ATOL):
    logits, loss, grads = patched
    ref_logits, ref_loss, ref_grads = reference
    torch.testing.assert_close(logits, ref_logits, rtol=rtol, atol=atol)
    torch.testing.assert_close(loss, ref_loss, rtol=rtol, atol=atol)
    assert grads.keys() == ref_grads.keys() and len(grads) > 10
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=rtol, atol=atol, msg=name)


@pytest.fixture
def runs(monkeypatch):
    spies = CandidateRuns(monkeypatch, "silu", "gelu", "silu_backward", "gelu_backward", "logsumexp")
    yield spies
    spies.close()


@pytest.fixture
def ids():
    torch.manual_seed(0)
    return torch.randint(0, VOCAB, (BATCH, SEQ))


def build_pair(make):
    """(reference built without the patch, a copy built under it with the same weights)."""
    torch.manual_seed(1)
    reference = make()
    with tunekit.patch():
        patched = make()
    patched.load_state_dict(reference.state_dict())
    return reference, patched


CASES = {  # name: (builder, the op its activation runs)
    "llama-silu": (llama, "silu"),
    "gpt2-gelu": (lambda: gpt2("gelu"), "gelu"),
    "gpt2-gelu_pytorch_tanh": (lambda: gpt2("gelu_pytorch_tanh"), "gelu"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_patched_model_step_matches_torch(case, ids, runs):
    make, op = CASES[case]
    reference, patched = build_pair(make)
    want = step(reference, ids)
    assert runs.total() == 0
    with tunekit.patch():
        got = step(patched, ids)
    assert runs.count(op) >= LAYERS  # every layer's MLP
    # the backward: torch's own node from C++ (ops/_shared/grad_call.py; conftest builds it), else tunekit's
    if fast_grad.load() is not None:
        assert runs.count(op + "_backward") == 0
    else:
        assert runs.count(op + "_backward") >= LAYERS
    assert_same_step(got, want)


@pytest.mark.parametrize("case", list(CASES))
def test_with_tuning_off_the_patched_model_is_bit_identical(case, ids, runs):
    make, op = CASES[case]
    reference, patched = build_pair(make)
    want = step(reference, ids)
    # the activation's family alone: the rms_norm patch replaces Hugging Face's seven-op RMSNorm by
    # torch's fused kernel, one rounding less (within tolerance: test_llama_rms_norm_patched_...)
    with tunekit.tuning(tuning=False), tunekit.patch([op]):
        got = step(patched, ids)
    assert runs.count(op) == LAYERS  # exactly one call per layer
    # every layer's result carries torch's own node (ops/_shared/grad_call.py; conftest builds it): no
    # tunekit backward runs
    assert runs.count(op + "_backward") == (0 if fast_grad.load() is not None else LAYERS)
    assert_same_step(got, want, rtol=0, atol=0)


def test_llama_rms_norm_patched_matches_torch_within_tolerance(ids, monkeypatch):
    """The default patch takes Hugging Face's LlamaRMSNorm modules: two per layer and the last one,
    each call tunekit's rms_norm (a candidate's run, or once torch's kernel is decided, the C++ route
    to torch's function), the step within tolerance of torch's."""
    from tunekit.ops.rms_norm import route

    spies = CandidateRuns(monkeypatch, "rms_norm")
    route.ready()  # installed now, so that the spy below stays the route
    routed, real = [], route.call

    def counted(*arguments):
        y = real(*arguments)
        if y is not None:
            routed.append(y)
        return y
    monkeypatch.setattr(route, "call", counted)
    reference, patched = build_pair(llama)
    want = step(reference, ids)
    with tunekit.patch():
        got = step(patched, ids)
    assert spies.count("rms_norm") + len(routed) >= 2 * LAYERS + 1
    assert_same_step(got, want)
    spies.close()


def test_llama_within_tolerance_when_silu_runs_another_candidate(ids, monkeypatch):
    """The tolerance holds for a candidate other than torch's kernel: every silu call runs the composite
    ``x * sigmoid(x)`` (rounded differently from torch's fused kernel)."""
    from tunekit.ops.silu import silu_op

    composite = silu_op.candidate("torch_x_sigmoid").run
    calls = []

    def forced(params):
        calls.append(params)
        return composite(params)

    for candidate in silu_op.candidates:
        monkeypatch.setattr(candidate, "run", forced)
    torch.manual_seed(1)
    model = llama()
    want = step(model, ids)
    with tunekit.patch():
        got = step(model, ids)
    assert len(calls) >= LAYERS
    assert not torch.equal(got[0], want[0]) or any(not torch.equal(got[2][k], want[2][k]) for k in want[2])
    assert_same_step(got, want)


def test_gpt2_built_before_the_patch_keeps_torchs_gelu(ids, runs):
    """transformers' GELU activations keep the F.gelu they saw at construction (module docstring)."""
    torch.manual_seed(1)
    model = gpt2("gelu")
    want = step(copy.deepcopy(model), ids)
    with tunekit.patch():
        got = step(model, ids)
    assert runs.count("gelu") == 0
    assert_same_step(got, want, rtol=0, atol=0)
