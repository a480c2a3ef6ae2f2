"""Rebuilding a recorded signature's inputs: params laid out exactly as a ``spec()`` says, on fresh
random values, so offline tuning (:mod:`tunekit.offline`) times and checks candidates on the very
layout (shapes, strides, dtypes, 16-byte alignment class, in-place aliasing) the program met.
"""

from __future__ import annotations

import inspect
from typing import Callable

import torch

from ..tunable.params import OpParams
from ..tunable.registry import get_op

__all__ = ["rebuild_params", "FIXUPS"]

#: constructor parameter -> the name ``spec()["arguments"]`` gives it, where they differ
_ARGUMENT_NAMES = {"dims": "dim"}


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def _random_fill(flat: torch.Tensor) -> None:
    """Random values, never all zeros: N(0, 9) like the ops' ``make_example``."""
    if flat.dtype.is_floating_point or flat.dtype.is_complex:
        flat.copy_(torch.randn(flat.shape, dtype=torch.float32, device=flat.device) * 3)
    elif flat.dtype == torch.bool:
        flat.copy_(torch.rand(flat.shape, device=flat.device) < 0.5)
    else:
        flat.copy_(torch.randint(1, 64, flat.shape, device=flat.device))


def _tensor(desc: dict, device: torch.device, what: str) -> torch.Tensor:
    """A tensor with exactly the recorded shape, strides, dtype and pointer offset mod 16 bytes, its
    whole memory span filled with random values."""
    if not isinstance(desc, dict):
        raise ValueError(f"{what}: expected a tensor description, got {desc!r}")
    shape, stride = [int(s) for s in desc["shape"]], [int(s) for s in desc["stride"]]
    dtype, align = _dtype(desc["dtype"]), int(desc.get("align", 0))
    if desc.get("device", device.type) != device.type:
        raise ValueError(f"{what} was recorded on {desc['device']}, cannot rebuild it on {device.type}")
    if len(shape) != len(stride) or any(s < 0 for s in shape + stride):
        raise ValueError(f"{what}: bad shape {shape} / stride {stride}")
    size = torch.empty((), dtype=dtype).element_size()
    if align % size or not 0 <= align < 16:
        raise ValueError(f"{what}: alignment {align} is impossible for {dtype}")
    span = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, stride))
    base = torch.empty(span + 16 // size, dtype=dtype, device=device)
    offset = ((align - base.data_ptr() % 16) % 16) // size
    _random_fill(base[offset:offset + span])
    t = base.as_strided(shape, stride, offset)
    assert span == 0 or t.data_ptr() % 16 == align
    return t


def _as_python(value):
    return tuple(_as_python(v) for v in value) if isinstance(value, list) else value


def _construct(cls: type[OpParams], tensors: dict, arguments: dict) -> OpParams:
    """``cls(**fields)`` matched by the constructor's parameter names (a params type may instead
    define ``from_spec(tensors, arguments)``)."""
    if hasattr(cls, "from_spec"):
        return cls.from_spec(tensors, arguments)
    kwargs, used = {}, set()
    for name, p in list(inspect.signature(cls.__init__).parameters.items())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        key = name if name in arguments else _ARGUMENT_NAMES.get(name, name)
        if name in tensors:
            kwargs[name] = tensors[name]
        elif key in arguments:
            kwargs[name] = _as_python(arguments[key])
            used.add(key)
        elif p.default is p.empty:
            raise ValueError(f"cannot rebuild {cls.__name__}: the spec gives no {name!r}")
    unused = set(arguments) - used
    if unused:
        raise ValueError(f"cannot rebuild {cls.__name__}: it takes no argument(s) {', '.join(sorted(unused))}")
    return cls(**kwargs)


def _consistent_lse(p) -> None:
    """logsumexp_backward's ``lse`` must be the logsumexp of its ``x`` (random values would make
    ``exp(x - lse)`` overflow in float16 and fail every candidate's numerical check)."""
    lse = torch.logsumexp(p.x.float(), p.dims, keepdim=p.keepdim)
    p.lse.copy_(lse.reshape(p.lse.shape).to(p.lse.dtype))


#: op name -> fix-up of rebuilt params whose inputs depend on each other
FIXUPS: dict[str, Callable[[OpParams], None]] = {"logsumexp_backward": _consistent_lse}


def rebuild_params(op, spec: dict, device) -> OpParams:
    """Params for ``op`` (a TunableOp or its name) on fresh random inputs laid out exactly as ``spec``
    (from ``params.spec()``) says, on ``device``. Outputs recorded as None stay None (the op
    allocates); an output recorded ``same_as`` an input is that input (in place)."""
    op = get_op(op) if isinstance(op, str) else op
    device = torch.device(device)
    if not isinstance(spec, dict):
        raise ValueError(f"spec must be an object, got {type(spec).__name__}")
    cls = op.params_type
    tensors = {}
    for name in cls.inputs:
        if name not in spec:
            raise ValueError(f"spec has no {name!r}")
        tensors[name] = _tensor(spec[name], device, name)
    for name in cls.outputs:
        desc = spec.get(name)
        if desc is None:
            tensors[name] = None
        elif isinstance(desc, dict) and desc.get("same_as") is not None:
            if desc["same_as"] not in tensors:
                raise ValueError(f"{name} is recorded as the same tensor as {desc['same_as']!r}, not an input")
            tensors[name] = tensors[desc["same_as"]]
        else:
            tensors[name] = _tensor(desc, device, name)
    arguments = spec.get("arguments") or {}
    params = _construct(cls, tensors, arguments)
    fix = FIXUPS.get(op.name)
    if fix is not None:
        fix(params)
    return params
