"""A training step of real models with and without ``tunekit.patch()``: what tunekit changes end to end.

Run: ``PYTHONPATH=src python benchmarks/suites/model_step.py --out DIR`` (GPU; needs ``pip install -e
'.[models]'`` for Hugging Face transformers). ``--smoke`` runs a tiny config on the CPU in seconds
(the CPU test suite runs it end to end); its times mean nothing.

Models (random weights, nothing downloaded), both in bfloat16 by default:

- LLaMA-style (``transformers.LlamaForCausalLM``): hidden 1024, MLP 2816, 16 heads, 4 layers, vocab
  32000; its MLP's ``SiLUActivation`` calls ``F.silu`` (and its backward) once per layer, and its
  nine ``LlamaRMSNorm`` modules (two per layer, one last) run tunekit's rms_norm under the patch.
- GPT-2-style (``GPT2LMHeadModel``): the same sizes, MLP 4096, ``activation_function=
  "gelu_pytorch_tanh"`` (``F.gelu(approximate="tanh")``; GPT-2's own ``"gelu_new"`` is a Python
  formula that calls no gelu kernel). transformers' GELU activations take ``F.gelu`` when the model
  is built, so the patched copy is built under the patch.

Method:

- Two copies of each model with the same weights: one built and run without tunekit, one built and
  run under ``tunekit.patch()`` (entered around each block of steps, not each step). The step:
  gradients set to None (host only), forward with ``labels`` (the LM loss), ``loss.backward()``.
- Warm-up steps first (``--warmup``, default 3), then patched steps until no signature is still
  tuning (tuning is spread over a signature's first calls): they include tunekit's tuning of each new
  signature (a fresh results file per run, tunekit's default budget unless ``--tuning-ms``) and the
  first CUDA C / Triton compilations. The first step's wall time, the steps and seconds until every
  signature decided are reported as first use. The settings are made process-wide (``tunekit.configure``), as autograd runs CUDA
  backward ops on its own thread, which does not see a ``tunekit.tuning()`` block.
- Then, once the C++ autograd calls are built (a fresh machine builds them for ~15 s on a worker;
  until then differentiable activation calls take the Python Function), ``--rounds`` rounds; each times ``--steps`` steps of every variant in turn (interleaved, so
  clock and thermal drift hit all variants alike). A step's time is CUDA events around forward and
  backward (``--smoke``: the host clock); the table reports the median over all timed steps and the
  spread (min-max).
- Each patched variant's loss on the first step is compared with the unpatched one's, and one extra
  step counts the tunekit calls per step (candidate runs, outside the timed steps).
- "until tuned": until a step meets no tuning session (a session under way that no step calls any
  more, e.g. an activation backward's once torch's node takes the activation, does not count).
- ``--compile``: both models ``torch.compile``'d (default mode; the patched one compiled under the
  patch, where the replacements hand dynamo torch's functions): issue 23 asks that the patched
  compiled step be as fast as torch's compiled step (tunekit must not cost compiled code its fusions).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import tunekit  # noqa: E402
from tunekit.backends import fast_grad  # noqa: E402
from tunekit.bench.measure import versions  # noqa: E402
from tunekit.tunable.registry import all_ops, get_op  # noqa: E402

OPS = ("silu", "silu_backward", "gelu", "gelu_backward", "logsumexp", "logsumexp_backward", "rms_norm",
       "rms_norm_backward", "mm", "addmm")
FULL = dict(hidden=1024, layers=4, heads=16, llama_mlp=2816, gpt2_mlp=4096, vocab=32000, batch=8, seq=512,
            dtype="bfloat16")
SMOKE = dict(hidden=64, layers=2, heads=4, llama_mlp=176, gpt2_mlp=256, vocab=128, batch=2, seq=16, dtype="float32")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def build(name: str, cfg: dict, transformers):
    if name == "llama":
        config = transformers.LlamaConfig(hidden_size=cfg["hidden"], intermediate_size=cfg["llama_mlp"],
                                          num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
                                          num_key_value_heads=cfg["heads"], vocab_size=cfg["vocab"],
                                          max_position_embeddings=max(cfg["seq"], 64), hidden_act="silu")
        return transformers.LlamaForCausalLM(config)
    config = transformers.GPT2Config(n_embd=cfg["hidden"], n_inner=cfg["gpt2_mlp"], n_layer=cfg["layers"],
                                     n_head=cfg["heads"], vocab_size=cfg["vocab"], n_positions=max(cfg["seq"], 64),
                                     activation_function="gelu_pytorch_tanh", resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def model_pair(name, cfg, transformers, device, dtype, patch_ops=None):
    """(torch model, patched copy built under ``tunekit.patch(patch_ops)``) with the same weights."""
    torch.manual_seed(0)
    plain = build(name, cfg, transformers).to(device=device, dtype=dtype)
    with tunekit.patch(patch_ops):
        patched = build(name, cfg, transformers).to(device=device, dtype=dtype)
    patched.load_state_dict(plain.state_dict())
    return plain, patched


def step(model, ids) -> torch.Tensor:
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach()


@contextmanager
def counting_tunekit_calls():
    """Counts tunekit calls per op while the block runs: candidate runs (the general path) and cached
    runners run by the op's fast call (the no-grad fast path, and the C++ autograd path's forward)."""
    counts = {op: 0 for op in OPS}
    saved = []
    for op in OPS:
        for candidate in get_op(op).candidates:
            run = candidate.run

            def spy(params, run=run, op=op):
                counts[op] += 1
                return run(params)

            saved.append((candidate, "run", run, spy))
            candidate.run = spy
        fast_call = get_op(op).fast_call

        def fast_spy(*args, fast_call=fast_call, op=op):
            y = fast_call(*args)
            counts[op] += y is not None
            return y

        saved.append((get_op(op), "fast_call", fast_call, fast_spy))
        get_op(op).fast_call = fast_spy
    try:
        yield counts
    finally:
        for owner, name, value, spy in saved:
            if getattr(owner, name) is spy:  # not replaced meanwhile (an op installs its C++ fast call once built)
                setattr(owner, name, value)


class Timer:
    """CUDA events around each step on a GPU; the host clock (after a sync) elsewhere."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def time_steps(self, fn, n: int) -> list[float]:
        if not self.cuda:
            out = []
            for _ in range(n):
                t0 = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t0) * 1e3)
            return out
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in events]


def measure_model(name, cfg, args, transformers, device, dtype, timer) -> dict:
    pair = model_pair(name, cfg, transformers, device, dtype, args.patch_ops)
    if args.compile:  # compiled at its first step; the patched one under the patch (its graph holds torch's ops)
        pair = tuple(torch.compile(m) for m in pair)
    models = dict(zip(("torch", "tunekit.patch"), pair))
    torch.manual_seed(1)
    ids = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), device=device)

    def one_step(model):
        model.zero_grad(set_to_none=True)  # host only: no kernel
        return step(model, ids)

    def in_variant(variant, fn):
        """``fn()`` with the patch active for the patched variant (entered once per block, not per step)."""
        if variant == "torch":
            return fn()
        with tunekit.patch(args.patch_ops):
            return fn()

    start, marks = time.perf_counter(), session_calls()
    losses = {v: in_variant(v, lambda: one_step(m).item()) for v, m in models.items()}  # first step: tunes
    first_use = {"first_step_s": time.perf_counter() - start, "steps_until_tuned": None}
    steps, busy = 1, tuning_since(marks)
    while steps < MAX_TUNING_STEPS and (steps < args.warmup or busy):
        if first_use["steps_until_tuned"] is None and not busy:
            first_use["steps_until_tuned"] = steps  # first use: the patched steps until every signature decided
        marks = session_calls()
        for v, m in models.items():
            in_variant(v, lambda: one_step(m))
        steps, busy = steps + 1, tuning_since(marks)
    if device.type == "cuda":
        torch.cuda.synchronize()
    if first_use["steps_until_tuned"] is None and not busy:
        first_use["steps_until_tuned"] = steps
    first_use["seconds_until_tuned"] = time.perf_counter() - start  # both variants' steps, synchronized
    if fast_grad.load() is not None:  # steady state: the C++ autograd calls built (a fresh machine: ~15 s)
        in_variant("tunekit.patch", lambda: one_step(models["tunekit.patch"]))  # installs them
    times = {v: [] for v in models}
    for _ in range(args.rounds):
        for v, m in models.items():
            times[v] += in_variant(v, lambda: timer.time_steps(lambda: one_step(m), args.steps))
    with counting_tunekit_calls() as calls:
        in_variant("tunekit.patch", lambda: one_step(models["tunekit.patch"]))
    medians = {v: statistics.median(t) for v, t in times.items()}
    return {"model": name, "losses": losses, "loss_diff": abs(losses["torch"] - losses["tunekit.patch"]),
            "median_ms": medians, "min_ms": {v: min(t) for v, t in times.items()},
            "max_ms": {v: max(t) for v, t in times.items()}, "steps_timed": len(times["torch"]),
            "speedup": medians["torch"] / medians["tunekit.patch"], "tunekit_calls_per_step": calls,
            "first_use": first_use}


#: patched steps the warm-up may add until no signature is still tuning
MAX_TUNING_STEPS = 200


def session_calls() -> dict:
    """{(op, settings id, signature): calls that met its session} over the tuning sessions under way."""
    return {(op.name, *key): n for op in all_ops() for key, n in op.session_calls().items()}


def tuning_since(marks: dict) -> bool:
    """Whether a signature the step calls is still tuning: a session under way that began or was met
    since ``marks`` (:func:`session_calls`). A session no call meets any more is not counted: e.g. an
    activation backward's, started at the first step by the Python autograd Function, once later steps
    record torch's own node for the activation (ops/_shared/grad_call.py) and never call it again."""
    return any(marks.get(k) != n for k, n in session_calls().items())


def tuned_choices(results) -> list[str]:
    store = tunekit.results_store(results)
    return [f"{e.op} `{e.signature}` -> `{e.choice}`" + ("" if e.complete else " (incomplete)")
            for op in OPS for e in store.entries(op)]


def _first_use(f: dict | None) -> str:
    if not f:
        return "–"
    steps = f["steps_until_tuned"] if f["steps_until_tuned"] is not None else f"> {MAX_TUNING_STEPS}"
    return f"{f['first_step_s']:.2f}, {steps} ({f['seconds_until_tuned']:.1f})"


def render(meta: dict, rows: list[dict]) -> str:
    compiled = " (both torch.compile'd)" if meta["args"].get("compile") else ""
    lines = [f"# Model training step (forward + backward){compiled}, torch vs `tunekit.patch()`: {meta['device']}", "",
             f"{meta['date']}; {meta['command']}; versions {meta['versions']}", "",
             f"Config: hidden {meta['config']['hidden']}, layers {meta['config']['layers']}, heads "
             f"{meta['config']['heads']}, vocab {meta['config']['vocab']}, batch {meta['config']['batch']}, seq "
             f"{meta['config']['seq']}, {meta['config']['dtype']}; timer: {meta['timer']}; median of "
             f"{rows[0]['steps_timed'] if rows else 0} steps per variant after {meta['args']['warmup']} warm-up steps.",
             "", "| model | torch ms | tunekit.patch ms | speedup | torch min-max | patched min-max | loss diff | "
                 "tunekit calls / step | first use: first step s, steps (s) until tuned |",
             "|---|---:|---:|---:|---|---|---:|---|---|"]
    for r in rows:
        calls = ", ".join(f"{op} {n}" for op, n in r["tunekit_calls_per_step"].items() if n) or "none"
        m, lo, hi = r["median_ms"], r["min_ms"], r["max_ms"]
        lines.append(f"| {r['model']} | {m['torch']:.3f} | {m['tunekit.patch']:.3f} | {r['speedup']:.3f}x | "
                     f"{lo['torch']:.3f}-{hi['torch']:.3f} | {lo['tunekit.patch']:.3f}-{hi['tunekit.patch']:.3f} | "
                     f"{r['loss_diff']:.2e} | {calls} | {_first_use(r.get('first_use'))} |")
    lines += ["", "Tuned choices:", ""] + [f"- {c}" for c in meta["tuned_choices"]] + [""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Method: see the module docstring (benchmarks/suites/model_step.py).")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--smoke", action="store_true", help="tiny config on the CPU, float32: an end-to-end check")
    ap.add_argument("--models", default="llama,gpt2", help="comma-separated: llama, gpt2 (default both)")
    for key in ("hidden", "layers", "batch", "seq", "vocab"):
        ap.add_argument(f"--{key}", type=int, help=f"default {FULL[key]} (smoke {SMOKE[key]})")
    ap.add_argument("--dtype", choices=list(DTYPES), help=f"default {FULL['dtype']} (smoke {SMOKE['dtype']})")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per variant, tuning included (default 3)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--steps", type=int, default=4, help="timed steps per variant per round (default 4)")
    ap.add_argument("--tuning-ms", type=float, help="tuning budget per signature (default: tunekit's, 200)")
    ap.add_argument("--results", help="tunekit results file (default: a fresh one, so this run tunes)")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile both models (default mode): the patched step must be as fast as torch's")
    ap.add_argument("--patch-ops", help="comma-separated ops to patch, e.g. silu,gelu,logsumexp,gemm "
                                        "(default: tunekit.patch()'s, GEMM left out)")
    args = ap.parse_args(argv)
    try:
        import transformers
    except ImportError:
        log("model_step: Hugging Face transformers is not installed: pip install -e '.[models]' (or pip install "
            "transformers)")
        return 2
    if args.smoke:
        device, cfg = torch.device("cpu"), dict(SMOKE)
        args.warmup, args.rounds, args.steps = min(args.warmup, 1), min(args.rounds, 2), min(args.steps, 2)
    elif not torch.cuda.is_available():
        log("model_step: no CUDA device here; this benchmark times GPU steps (use --smoke for a CPU check)")
        return 2
    else:
        device, cfg = torch.device("cuda"), dict(FULL)
    cfg.update({k: v for k, v in vars(args).items() if k in cfg and v is not None})
    dtype = DTYPES[cfg["dtype"]]
    results = args.results or str(Path(tempfile.mkdtemp(prefix="tunekit-model-step-")) / "results.sqlite")
    args.patch_ops = [o.strip() for o in args.patch_ops.split(",")] if args.patch_ops else None
    tunekit.configure(results=results, **({} if args.tuning_ms is None else {"max_tuning_ms": args.tuning_ms}))
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    timer = Timer(device)
    rows = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        if name not in ("llama", "gpt2"):
            ap.error(f"unknown model {name!r}")
        log(f"{name}: building and warming up ({device_name}, {cfg['dtype']})")
        rows.append(measure_model(name, cfg, args, transformers, device, dtype, timer))
        log(f"{name}: torch {rows[-1]['median_ms']['torch']:.3f} ms, patched {rows[-1]['median_ms']['tunekit.patch']:.3f} ms")
    meta = {"device": device_name, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "versions": {**versions(), "transformers": transformers.__version__},
            "command": " ".join(["python benchmarks/suites/model_step.py"] + (argv if argv is not None else sys.argv[1:])),
            "config": cfg, "args": vars(args), "results": results, "tuned_choices": tuned_choices(results),
            "timer": "CUDA events" if timer.cuda else "host clock (smoke run: times mean nothing)"}
    text = render(meta, rows)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"model_step{'-smoke' if args.smoke else ''}{'-compiled' if args.compile else ''}-{device_name.replace(' ', '_')}"
    (out_dir / f"{stem}.md").write_text(text)
    (out_dir / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
