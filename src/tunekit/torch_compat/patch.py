"""``tunekit.patch()``: existing PyTorch code runs tunekit's ops, reversibly.

Usage::

    with tunekit.patch():                # every op but GEMM (opt-in: patch([..., "gemm"])); patch(["silu"]) for some
        loss = model(x).sum()            # F.silu, F.gelu, nn.SiLU/GELU, torch.logsumexp -> tunekit
        loss.backward()                  # the tuned backward ops
    handle = tunekit.patch()             # or as a plain call: active until undone
    ...
    handle.undo()                        # (alias: restore) torch is as it was

What is replaced, per op family (``ops`` picks among their names; each op module lists its targets
in its ``FAMILY``, and this module only applies and undoes them):

- silu: ``torch.nn.functional.silu`` and ``torch.nn.SiLU.forward``;
- gelu: ``torch.nn.functional.gelu`` and ``torch.nn.GELU.forward``;
- logsumexp: ``torch.logsumexp`` and ``torch.Tensor.logsumexp``.

Why replace Python attributes and not register aten overrides (``torch.library`` impls of
``aten::silu`` for CUDA)? An aten override is process-wide and cannot be taken back cleanly
(``torch.library`` registrations last as long as their Library object, and one op has one kernel
per dispatch key, so two users would fight over it); it would catch torch's own internal calls,
where tunekit's ``out=`` / in-place rules and its calls back into torch would recurse; and it
would sit under autograd, so tunekit's tuned backward ops would not run. Replacing the Python
entry points keeps tunekit's autograd Functions, can be undone exactly, and leaves torch's
internals alone. Its limits follow from the same choice:

- code that took a reference before the patch keeps torch's function: ``from torch.nn.functional
  import silu`` at import time, ``functools.partial(F.gelu, ...)``, ``self.act = F.gelu`` in a
  module's ``__init__`` (Hugging Face transformers' ``GELUActivation`` / ``GELUTanh`` do this:
  build such models while the patch is active). A reference taken while patched stays harmless
  after undo: each replacement checks whether its patch is still active and otherwise calls torch;
- calls made inside torch's C++ (composite ops, ``torch.nn.functional.*`` implemented in C++ that
  call silu internally, decompositions) are not affected, nor ``torch.special.logsumexp``;
- under torch.compile / torch.export the replacements hand the call to torch's function (dynamo
  traces the replacement, folds ``torch.compiler.is_compiling()`` and sees torch's op), so compiled
  graphs hold torch's ops, which the compiler fuses (the "eager" backend's generated Python looks
  ``torch.logsumexp`` up again when it runs, so there tunekit runs it). ``torch.jit.script`` cannot
  compile the replacements: script before patching;
- ``__torch_function__`` overrides see the replacement as ``func`` where torch looks the name up at
  call time (``F.silu``'s Python body, ``Tensor`` methods); calling it gives torch's result, but a
  table built before the patch does not know it;
- a patch is process-wide: all threads see it while any patch is active. The routing check costs
  about 1 us per call on the host.

Every argument form tunekit does not handle goes to the original torch function unchanged: ``out=``,
``dim`` as a name (a string) or an empty tuple, positional forms torch would refuse, tensor
subclasses and ``__torch_function__`` types, non-float dtypes, modes and traces
(``tunekit/ops/_shared/routing.py`` lists them), and ``torch.logsumexp`` under autocast (some backends put
logsumexp on their float32 list; silu and gelu are on no autocast list for CPU or CUDA).

Reversibility: each patched attribute keeps a count of the active patches that use it. The first
saves torch's value (the attribute's own entry, or its absence when it is inherited, as
``Tensor.logsumexp`` is from ``torch._C.TensorBase``) and installs the replacement; the last
puts the saved value back. Patches nest and may be undone in any order; undo twice is a no-op;
a context manager undoes on exceptions. One lock orders patch and undo between threads. If
someone else replaced the attribute while it was patched, undo leaves their value in place and
warns (the replacement, wherever it is still referenced, falls through to torch); if they later
put the replacement back, the next patch's undo restores torch's entry. torch's lazily built
tables of its own functions (dynamo's trace rules, ``torch.overrides``' lists) are built from
torch's objects before the first replacement goes in, and dynamo's are dropped at the last undo if
dynamo was first imported while patched (else torch.compile would refuse ``torch.logsumexp`` after).
"""

from __future__ import annotations

import inspect
import sys
import threading
import warnings

import torch

from ..ops import FAMILIES
from ..tunable.errors import TunekitWarning

__all__ = ["patch", "Patch", "PATCHABLE_OPS", "DEFAULT_PATCH_OPS", "PatchedAttribute", "attributes_of"]

_MISSING = object()  # "the owner had no entry of its own for this name"
_LOCK = threading.Lock()


class PatchedAttribute:
    """One attribute of torch that patches replace: where it lives, what torch had there, the
    replacement, and how many active patches need it (``users``)."""

    def __init__(self, owner, name: str, make_replacement):
        self.owner, self.name = owner, name
        self.users = 0
        #: the owner's own entry before the first patch (``_MISSING``: inherited, deleted on restore)
        self.saved = vars(owner).get(name, _MISSING)
        #: the callable torch resolved before the first patch; the replacement's fallback, kept after
        #: undo so that references to the replacement taken while patched still reach torch
        self.original = getattr(owner, name)
        self.replacement = make_replacement(self)

    def acquire(self) -> None:
        if self.users == 0:
            # The entry is our replacement when someone who replaced it while patched put it back
            # after our undo: then torch's entry is still the one saved last time.
            if vars(self.owner).get(self.name, _MISSING) is not self.replacement:
                self.saved = vars(self.owner).get(self.name, _MISSING)
                self.original = getattr(self.owner, self.name)
            self.users = 1
            setattr(self.owner, self.name, self.replacement)
        else:
            self.users += 1

    def release(self) -> None:
        self.users -= 1
        if self.users:
            return
        if vars(self.owner).get(self.name, _MISSING) is not self.replacement:
            warnings.warn(f"tunekit.patch: {self.qualified_name} was replaced by someone else while patched; "
                          f"left as it is", TunekitWarning, stacklevel=4)
        elif self.saved is _MISSING:
            delattr(self.owner, self.name)
        else:
            setattr(self.owner, self.name, self.saved)

    @property
    def qualified_name(self) -> str:
        owner = getattr(self.owner, "__qualname__", None) or self.owner.__name__
        module = getattr(self.owner, "__module__", None)
        return f"{module}.{owner}.{self.name}" if isinstance(self.owner, type) and module else f"{owner}.{self.name}"

    def __repr__(self) -> str:
        return f"<PatchedAttribute {self.qualified_name}: {self.users} active patch(es)>"


def _attribute(owner, name, make_replacement) -> PatchedAttribute:
    attr = PatchedAttribute(owner, name, make_replacement)
    fn = attr.replacement
    fn.__name__ = name
    fn.__qualname__ = f"{getattr(owner, '__qualname__', owner.__name__)}.{name}"
    fn.__doc__ = (f"tunekit.patch's replacement of {attr.qualified_name}: tunekit's op for the calls it takes, "
                  f"torch's function for every other call (and whenever no patch is active).\n\n"
                  + (inspect.getdoc(attr.original) or ""))
    try:
        fn.__signature__ = inspect.signature(attr.original)
    except (TypeError, ValueError):  # builtins without a text signature
        pass
    return attr


#: op family name -> the attributes its patch replaces (created once: the same replacement objects every
#: time); a target in another library (owner "module:Class") joins once a patch starts after its import
_ATTRIBUTES: dict[str, tuple[PatchedAttribute, ...]] = {
    family.name: tuple(_attribute(t.owner, t.name, t.make_replacement) for t in family.patches
                       if not isinstance(t.owner, str))
    for family in FAMILIES if family.patches
}
_LATER = {family.name: tuple(t for t in family.patches if isinstance(t.owner, str)) for family in FAMILIES}
_JOINED: set = set()  # the targets of _LATER already in _ATTRIBUTES
PATCHABLE_OPS = tuple(_ATTRIBUTES)
#: what ``patch()`` with no ``ops`` patches: the families that patch by default (GEMM is named to be patched)
DEFAULT_PATCH_OPS = tuple(f.name for f in FAMILIES if f.patches and f.patch_by_default)
_ALL_ATTRIBUTES = [a for attrs in _ATTRIBUTES.values() for a in attrs]


def _join_imported_targets(op: str) -> None:
    """Add ``op``'s targets in other libraries whose module is imported by now (never importing one:
    ``transformers.models.llama.modeling_llama:LlamaRMSNorm`` is patched once the program uses it)."""
    for target in _LATER.get(op, ()):
        if target in _JOINED:
            continue
        module_name, _, class_name = target.owner.partition(":")
        owner = getattr(sys.modules.get(module_name), class_name, None)
        if isinstance(owner, type) and hasattr(owner, target.name):
            attr = _attribute(owner, target.name, target.make_replacement)
            _ATTRIBUTES[op] += (attr,)
            _ALL_ATTRIBUTES.append(attr)
            _JOINED.add(target)


def _build_torch_tables_from_originals() -> None:
    """Before the first replacement goes in: torch builds some tables of its own functions lazily, keyed
    by the function objects (dynamo's trace rules: which callables go into a graph as torch ops;
    ``torch.overrides``' lists, which FX uses to tell methods from functions). Built while patched,
    they would hold the replacements and miss torch's functions after undo (torch.compile then
    refuses ``torch.logsumexp`` as an unknown builtin). Build them now, from torch's own objects
    (12 ms once; dynamo's only when it is already imported: importing it costs a second). These are
    torch internals: where they differ (another torch version), the patch goes on with a warning."""
    rules = sys.modules.get("torch._dynamo.trace_rules")
    try:
        torch.overrides._get_overridable_functions()
        torch.overrides._get_tensor_methods()
        if rules is not None:
            rules.get_torch_obj_rule_map()
            rules.get_tensor_method()
    except Exception as exc:  # noqa: BLE001 - best effort, see the docstring
        warnings.warn(f"tunekit.patch: could not pre-build torch's function tables ({exc!r}); torch.compile "
                      f"may not know torch's own functions after undo", TunekitWarning, stacklevel=4)


def _drop_tables_built_while_patched() -> None:
    """After the last replacement went out: if dynamo was first imported while patched, its tables
    hold replacements; drop them (torch rebuilds them on next use, from torch's objects)."""
    rules = sys.modules.get("torch._dynamo.trace_rules")
    if rules is None or not hasattr(rules, "clear_lru_cache"):
        return
    in_graph = rules.get_torch_obj_rule_map()
    if any(a.replacement in in_graph for a in _ALL_ATTRIBUTES) or any(
            a.original not in rules.get_tensor_method() for a in _ALL_ATTRIBUTES if a.owner is torch.Tensor):
        rules.clear_lru_cache()


def attributes_of(op: str) -> tuple[PatchedAttribute, ...]:
    """The attributes a patch of ``op`` replaces (for tests and inspection)."""
    return _ATTRIBUTES[op]


def _op_names(ops) -> tuple[str, ...]:
    if ops is None:
        return DEFAULT_PATCH_OPS
    if isinstance(ops, str):
        ops = (ops,)
    names = []
    for op in ops:
        if op not in _ATTRIBUTES:
            raise ValueError(f"tunekit.patch: unknown op {op!r}; choose among {', '.join(PATCHABLE_OPS)}")
        if op not in names:
            names.append(op)
    return tuple(names)


class Patch:
    """An active patch (made by :func:`patch`): ``undo()`` / ``restore()`` ends it; as a context
    manager it ends at the end of the ``with`` block, exception or not."""

    def __init__(self, ops=None):
        self.ops = _op_names(ops)
        with _LOCK:
            for op in self.ops:
                _join_imported_targets(op)
            self._attributes = [a for op in self.ops for a in _ATTRIBUTES[op]]
            if not any(a.users for a in _ALL_ATTRIBUTES):
                _build_torch_tables_from_originals()
            done = []
            try:
                for attr in self._attributes:
                    attr.acquire()
                    done.append(attr)
            except BaseException:
                for attr in reversed(done):
                    attr.release()
                raise
            self._active = True

    @property
    def active(self) -> bool:
        return self._active

    def undo(self) -> None:
        """End this patch; torch's attributes come back when no other active patch uses them.
        Calling it again does nothing."""
        with _LOCK:
            if not self._active:
                return
            self._active = False
            for attr in reversed(self._attributes):
                attr.release()
            if not any(a.users for a in _ALL_ATTRIBUTES):
                _drop_tables_built_while_patched()

    restore = undo

    def __enter__(self) -> "Patch":
        if not self._active:
            raise RuntimeError("tunekit.patch: this patch was undone; call tunekit.patch() again")
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.undo()

    def __repr__(self) -> str:
        return f"<tunekit.patch {', '.join(self.ops)}: {'active' if self._active else 'undone'}>"


def patch(ops=None) -> Patch:
    """Route existing code's calls of torch's functions through tunekit until undone.

    ``ops``: None (``DEFAULT_PATCH_OPS``: every family but GEMM, which is opt-in, e.g.
    ``patch(["silu", "gelu", "logsumexp", "gemm"])``), one name, or a sequence of names. Returns the
    :class:`Patch` handle (``undo()`` / ``restore()``; a context manager). The module docstring
    says what is replaced, why this way, and the limits.
    """
    return Patch(ops)
