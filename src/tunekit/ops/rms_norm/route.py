"""rms_norm calls whose decided choice is torch's kernel, handed to torch's own function from C++.

Why: with torch's kernel chosen, tunekit's public function still checked the arguments, built params
and looked the decision up in Python before calling torch: on the CPU host (4 x 64 float32)
``tunekit.rms_norm`` took 20.4 us forward against ``F.rms_norm``'s 14.6, and 110-112 us forward +
backward against 96-98 (the same steps cost 2-3x more inside a training loop than alone), as on the
H200 (112 against 92 us per norm, ``benchmarks/results/rms_norm_host-NVIDIA_H200.txt``).

The GEMM family's C++ route (``backends/fast_gemm.cpp``, form 6) reads a call's layout from the
``at::Tensor`` fields, looks it up in this module's table and calls ``at::rms_norm``: torch's result,
torch's autograd node, torch's host time. The public function fills the table (:func:`learn`) when it
finds torch's kernel decided for a call that needs gradients (there the general path runs torch's
own function as well). The table is per settings (``cache_id``) and dropped whenever the op drops
its choices. Until the extension is built (on a worker, at the first learning), or without it
(``TUNEKIT_FAST_CALL=0``, no compiler), nothing is routed.
"""

from __future__ import annotations

import torch

from ...backends import fast_gemm
from ...tunable import context

__all__ = ["call", "learn", "forget", "routed_keys", "ready"]

#: fast_gemm.cpp's form code for rms_norm
FORM = 6

_routes: dict = {}  # {settings.cache_id: {key: True}}: the C++ route reads it


def _unrouted(*arguments):
    return None


call = _unrouted  # call(x, normalized_shape, weight, eps): torch's result, or None; the C++ route once built
_key = _unrouted


def _install(module) -> None:
    global call, _key
    route = module.GemmRoute(FORM, _routes, context._current, context, (torch.Tensor, torch.nn.Parameter))
    call, _key = route, route.key


def learn(x, normalized_shape, weight, eps) -> None:
    """Route the layout of this call, whose decided choice is torch's kernel (current settings)."""
    if not _installer.started:
        _installer.start()
    key = _key(x, normalized_shape, weight, eps)
    s = context.current()
    if key is not None and s.enabled:
        _routes.setdefault(s.cache_id, {})[key] = True


def forget() -> None:
    _routes.clear()


def routed_keys(s: context.TuningSettings | None = None) -> dict:
    """{key: True} for the settings (the current ones by default): what the table holds (tests)."""
    return dict(_routes.get((s or context.current()).cache_id, {}))


#: builds the extension and installs the route (``ready()``: now, waiting; tests and benchmarks)
_installer = fast_gemm.Installer(_install)
ready = _installer.ready
