"""Drop-in modules: ``tunekit.nn.SiLU`` and ``tunekit.nn.GELU`` in place of ``torch.nn.SiLU`` / ``torch.nn.GELU``.

They subclass torch's modules, so everything that looks at a module sees torch's: ``isinstance(m,
torch.nn.SiLU)``, the constructor arguments, ``repr`` / ``extra_repr``, an empty ``state_dict``,
pickling (by reference to these classes), ``.to()`` / ``.half()`` and hooks. Only ``forward``
differs: it calls :func:`tunekit.silu` / :func:`tunekit.gelu` (tuned kernels, tuned backward),
for the inputs where tunekit gives torch's results; any other input (a tensor subclass, an integer
dtype, a trace by torch.compile or ``torch.jit.trace``, a ``__torch_function__`` mode...: the list
is in ``tunekit/_routing.py``) runs torch's own forward, unchanged.

To change modules you do not construct yourself, see :func:`tunekit.patch`, which also reroutes
``torch.nn.SiLU`` / ``torch.nn.GELU`` forwards and the functional forms.
"""

from __future__ import annotations

import torch

from ._routing import run_gelu, run_silu, takes

__all__ = ["SiLU", "GELU"]

_torch_gelu_ = torch._C._nn.gelu_  # torch's in-place GELU (F.gelu has no inplace argument)


class SiLU(torch.nn.SiLU):
    """``torch.nn.SiLU(inplace=False)`` whose forward runs :func:`tunekit.silu` (``inplace`` honoured)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        inplace = self.inplace
        if type(inplace) is bool and takes(input):
            return run_silu(input, inplace)
        return super().forward(input)


class GELU(torch.nn.GELU):
    """``torch.nn.GELU(approximate="none")`` whose forward runs :func:`tunekit.gelu`.

    ``inplace=True`` (keyword only, not in torch's module; torch has ``torch._C._nn.gelu_``) writes
    the result into the input, as ``SiLU(inplace=True)`` does, saving an allocation where the
    input is not needed afterwards. The default keeps torch's constructor, repr and behaviour.
    """

    #: the default for instances unpickled from before the attribute existed
    inplace: bool = False

    def __init__(self, approximate: str = "none", *, inplace: bool = False) -> None:
        super().__init__(approximate)
        self.inplace = inplace

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        approximate, inplace = self.approximate, self.inplace
        if (type(approximate) is str and (approximate == "none" or approximate == "tanh")
                and type(inplace) is bool and takes(input)):
            return run_gelu(input, approximate, inplace)
        if inplace:
            return _torch_gelu_(input, approximate=approximate)
        return super().forward(input)

    def extra_repr(self) -> str:
        text = super().extra_repr()
        return f"{text}, inplace=True" if self.inplace else text
