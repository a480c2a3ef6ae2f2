"""``tunekit.nn``: drop-in modules in place of torch's (``tunekit.nn.SiLU`` for ``torch.nn.SiLU``,
``tunekit.nn.GELU`` for ``torch.nn.GELU``).

They subclass torch's modules, so everything that looks at a module sees torch's: ``isinstance(m,
torch.nn.SiLU)``, the constructor arguments, ``repr`` / ``extra_repr``, an empty ``state_dict``,
pickling (by reference to these classes), ``.to()`` / ``.half()`` and hooks. Only ``forward``
differs: it calls the tunekit op for the inputs where tunekit gives torch's results; any other input
(a tensor subclass, an integer dtype, a trace by torch.compile or ``torch.jit.trace``, a
``__torch_function__`` mode...: the list is in ``tunekit/ops/_shared/routing.py``) runs torch's own
forward, unchanged. Each op module defines its classes; this module gathers them from the op
families (``tunekit/ops/__init__.py``).

To change modules you do not construct yourself, see :func:`tunekit.patch`, which also reroutes
``torch.nn.SiLU`` / ``torch.nn.GELU`` forwards and the functional forms.
"""

from __future__ import annotations

from ..ops import FAMILIES

#: every drop-in module class, by name (``SiLU`` from ``ops/silu.py``, ``GELU`` from ``ops/gelu.py``, ...)
MODULES = {name: cls for family in FAMILIES for name, cls in family.modules.items()}

globals().update(MODULES)  # tunekit.nn.SiLU, tunekit.nn.GELU, ...: adding an op adds its modules here
__all__ = sorted(MODULES)
