"""Config: a kernel's compile-time and launch parameters as one value (after Triton's
``triton.Config``), so that fifty candidates are one class and a list of configs.

A config is immutable, hashable and ordered by its field names, so it can key a cache, go into a
candidate's source hash, and name the candidate::

    Config(BLOCK=1024, num_warps=4).name("silu_triton", BLOCK="b", num_warps="w")  # "silu_triton_b1024_w4"
"""

from __future__ import annotations

from typing import Any

__all__ = ["Config"]


class Config:
    """Named parameters of one kernel configuration: ``config.BLOCK``, ``config["BLOCK"]``."""

    __slots__ = ("_items",)

    def __init__(self, **values: Any):
        object.__setattr__(self, "_items", tuple(sorted(values.items())))

    def __getattr__(self, name: str) -> Any:
        for key, value in object.__getattribute__(self, "_items"):
            if key == name:
                return value
        raise AttributeError(f"config has no {name!r}; it has {', '.join(k for k, _ in self._items)}")

    def __getitem__(self, name: str) -> Any:
        return self.__getattr__(name)

    def __setattr__(self, name, value):
        raise AttributeError("a Config is immutable: use replace()")

    def get(self, name: str, default: Any = None) -> Any:
        return dict(self._items).get(name, default)

    def as_dict(self) -> dict[str, Any]:
        return dict(self._items)

    def replace(self, **changes: Any) -> "Config":
        return Config(**{**self.as_dict(), **changes})

    def name(self, prefix: str, **abbreviations: str) -> str:
        """``prefix`` and the values of the abbreviated fields, in the order given:
        ``name("x", BLOCK="b", num_warps="w")`` -> ``x_b1024_w4``."""
        values = self.as_dict()
        return "_".join([prefix] + [f"{short}{values[key]}" for key, short in abbreviations.items()])

    def __eq__(self, other) -> bool:
        return isinstance(other, Config) and self._items == other._items

    def __hash__(self) -> int:
        return hash(self._items)

    def __repr__(self) -> str:
        return "Config(" + ", ".join(f"{k}={v!r}" for k, v in self._items) + ")"
