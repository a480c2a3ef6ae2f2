"""Torch's own function for the GEMM calls whose tuned answer is torch's own kernels.

Most GEMM signatures of a model tune to torch's kernel (``torch_mm`` / ``torch_addmm``: cuBLAS on a
GPU). For those, tunekit's general path only adds host time: its form checks, a params object and
its cache key, and under autograd a Python autograd Function whose backward builds params again for
each of its GEMMs. A host-bound model step pays that on every layer, and can end up slower than
torch (``benchmarks/results/model_step-gemm_patched-NVIDIA_H200.md``: 0.82x with every GEMM on
torch's kernel).

A *route* hands such a call to torch's own function. For each public form (linear, mm, addmm, bmm,
baddbmm, matmul) a ``GemmRoute`` (``backends/fast_gemm.cpp``) reads the call's layout key in C++ and,
where this module's table routes the key, calls torch's function from C++: torch's result, torch's
autograd node, torch's host time. The general path fills the table (:func:`learn`): a key is routed
when the decisions for every GEMM the call makes are the ops' defaults: the forward's, and, when
autograd records the call, those of the GEMMs its backward runs. tunekit's backward
(:class:`~tunekit.ops.gemm.autograd.GemmFunction`) would run those same default kernels, as torch's
backward does. The backward's incoming gradient is predicted to be laid out like the output (a fresh
contiguous tensor: what autograd passes but in unusual graphs); a backward that gets another layout
still runs torch's kernels: correct, and what tunekit runs untuned.

A key whose decisions include another candidate is never routed. One whose decisions are not all
made yet (tuning spread over calls, a backward not run yet) is looked at again on a later general-path
call once the GEMM ops have decided another signature under the same settings (a count read per call):
a call whose backward never runs (or always gets a gradient of another layout) pays for no lookup
while nothing changes, and a key is routed on the call after its last GEMM is decided (a schedule of
calls 1, 2, 4 ... 64, then every 64th, left a LLaMA-style step's last undecided linear on the general
path for its first 127 calls: 0.89x torch's step, H200).
The table is per settings (``cache_id``, as choices are) and is dropped whenever the ``mm`` or
``addmm`` op drops choices (``TunableOp.on_forget``). Without the C++ extension (not buildable, or
``TUNEKIT_FAST_CALL=0``) nothing is routed; until it is built (on a worker, at the first GEMM call)
neither.
"""

from __future__ import annotations

import torch

from . import launch_plans
from .autograd import backward_operands
from .checks import needs_grad
from .op import CHALLENGER_HOST_MS, addmm_op, mm_op
from .params import AddmmParams, GemmParams
from ...backends import fast_gemm
from ...tunable import context

__all__ = ["FORMS", "learn", "ready", "routed_keys", "forget", "verdict", "recorded", "products", "linear", "mm", "addmm", "bmm", "baddbmm", "matmul"]

#: the public forms, in the order of fast_gemm.cpp's form codes
FORMS = ("linear", "mm", "addmm", "bmm", "baddbmm", "matmul")

_routes: dict = {}  # {settings.cache_id: {key: True (routed) / False (never)}}: the C++ routes read it
_looked: dict = {}  # {(cache_id, key): the GEMM ops' decision count when it was last found undecided}


class _Unrouted:
    """A form's route before (or without) the C++ extension: no call is routed, no key is read."""

    def __call__(self, *operands):
        return None

    def key(self, *operands):
        return None


linear = mm = addmm = bmm = baddbmm = matmul = _Unrouted()


def _install(module) -> None:
    """Put the C++ routes in place of the unrouted ones (from the build worker)."""
    types = (torch.Tensor, torch.nn.Parameter)
    made = {form: module.GemmRoute(code, _routes, context._current, context, types) for code, form in enumerate(FORMS)}
    globals().update(made)


def forget() -> None:
    """Drop every routed and refused key (the ops dropped their choices)."""
    _routes.clear()
    _looked.clear()


mm_op.on_forget.append(forget)
addmm_op.on_forget.append(forget)


def routed_keys(s: context.TuningSettings | None = None) -> dict:
    """{key: routed?} for the settings (the current ones by default): what the table holds (tests)."""
    return dict(_routes.get((s or context.current()).cache_id, {}))


def _slight(op, r) -> bool:
    """Whether decision ``r`` (another candidate than ``op``'s default) saves less device time than
    :data:`CHALLENGER_HOST_MS`, by its entry's times: on a call autograd records, not worth the
    general path's host time (its plan is for calls autograd does not record)."""
    e = r.entry
    mine = e.candidates.get(r.candidate.name) if e is not None else None
    base = e.candidates.get(op.default.name) if e is not None else None
    if mine is None or base is None or mine.time_ms is None or base.time_ms is None:
        return False
    return base.time_ms - mine.time_ms < CHALLENGER_HOST_MS


def recorded(operands: tuple) -> bool:
    """Whether autograd records a call on ``operands``: grad mode on and one of them requires grad (a
    bias alone too: its products hold no backward GEMM, yet the call needs torch's or tunekit's node)."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in operands)


def verdict(products, s, is_recorded: bool | None = None) -> bool | None:
    """True when every ``(op, params)`` is decided for the op's default, False when one is decided
    for another candidate, None while one is undecided. For a call autograd records (``is_recorded``;
    by default: ``products`` holds its backward's GEMMs too) a challenger that saves less than
    :data:`CHALLENGER_HOST_MS` counts as the default: torch's function from C++ costs the host less
    than that saves."""
    undecided, recorded = False, len(products) > 1 if is_recorded is None else is_recorded
    for op, params in products:
        r = op.decision(params, s)
        if r is None:
            undecided = True
        elif r.candidate is not op.default and not (recorded and _slight(op, r)):
            return False
    return None if undecided else True


def products(c, a, b, dz, weight: bool = False) -> list:
    """The GEMMs of ``c + a @ b`` (``weight``: ``a @ b.T``) as ``(op, params)``: the forward, and
    when autograd records it the backward's, for an incoming gradient laid out as ``dz``."""
    B = b.mT if weight else b
    done = [(mm_op, GemmParams(a, B)) if c is None else (addmm_op, AddmmParams(c, a, B))]
    if needs_grad(c, a, b):
        pairs = backward_operands(dz, a, b, weight, a.requires_grad, b.requires_grad)
        done += [(mm_op, GemmParams(x, y)) for x, y in pairs]
    return done


def _decided_plan(products, s, operands: tuple, result):
    """A plan (``launch_plans.py``) for a call autograd does not record whose one GEMM is decided for a
    plannable Triton candidate; ``launch_plans.LATER`` while the plans' extension builds; else None
    (also when making it fails, out of memory say: the call itself has succeeded)."""
    if result is None or len(products) != 1 or recorded(operands):
        return None
    op, params = products[0]
    r = op.decision(params, s)
    try:
        return launch_plans.make(r.candidate, params, operands, result) if r is not None else None
    except Exception:  # noqa: BLE001 - a plan is an optimisation: the general path keeps the key
        return None


def learn(route, operands: tuple, plan, result: torch.Tensor | None = None) -> None:
    """After the general path ran a call of ``route``'s form on ``operands``: route its key, refuse
    it, or keep a plan of its launches (``result``: the call's result), once its GEMMs are decided
    (``plan()``: their :func:`products`). A plan that is not ready yet (its extension builds) leaves
    the key to a later call."""
    if not _installer.started:
        _installer.start()
    key = route.key(*operands)
    if key is None:
        return
    s = context.current()
    if not s.enabled:
        return
    table = _routes.setdefault(s.cache_id, {})
    if key in table:
        return
    decided = mm_op.decisions(s) + addmm_op.decisions(s)
    if _looked.get((s.cache_id, key)) == decided:  # nothing decided since it was last found undecided
        return
    made = plan()
    found = verdict(made, s, recorded(operands))
    if found is False:
        planned = _decided_plan(made, s, operands, result)
        if planned is launch_plans.LATER:  # its extension builds: asked again on a later call
            return
        found = planned or False
    if found is None:
        _looked[(s.cache_id, key)] = decided
    else:
        table[key] = found
        _looked.pop((s.cache_id, key), None)


#: builds the extension and installs the routes (``ready()``: now, waiting; tests and benchmarks)
_installer = fast_gemm.Installer(_install)
ready = _installer.ready
