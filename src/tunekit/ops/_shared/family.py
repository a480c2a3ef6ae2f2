"""OpFamily: everything one op module offers the rest of tunekit, as one value.

An op module (``tunekit/ops/silu.py``) defines its params, candidates, tunable ops, public
functions, autograd and ``torch.library`` custom ops, and ends with a ``FAMILY`` naming what the
layers above it pick up: the public functions (``tunekit.<name>``), drop-in modules
(``tunekit.nn.<name>``), the torch attributes ``tunekit.patch()`` reroutes, and the custom ops.
``tunekit/ops/__init__.py`` lists the families, one line each: adding an op is its own module plus
that line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["OpFamily", "PatchTarget"]


@dataclass(frozen=True)
class PatchTarget:
    """One attribute of torch that ``tunekit.patch()`` replaces while a patch of the family is active.

    ``make_replacement(attribute)`` builds the replacement once; ``attribute`` is the patch's record
    of it, with ``users`` (active patches: 0 once undone, when the replacement must call torch) and
    ``original`` (torch's callable, which every call tunekit does not take goes to, unchanged).
    ``owner`` is an object, or ``"module:Class"`` for a class of another library: patched by the
    patches that start once its module is imported (tunekit never imports it)."""

    owner: Any
    name: str
    make_replacement: Callable[[Any], Callable]


@dataclass(frozen=True)
class OpFamily:
    """An op module's offer: ``name`` is what ``tunekit.patch(ops=[...])`` takes."""

    name: str
    functions: dict[str, Callable]
    modules: dict[str, type] = field(default_factory=dict)
    patches: tuple[PatchTarget, ...] = ()
    #: whether ``tunekit.patch()`` with no ``ops`` patches this family (False: only when named)
    patch_by_default: bool = True
    custom_ops: dict[str, Any] = field(default_factory=dict)
