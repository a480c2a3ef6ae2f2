"""torch's own ModuleInfo samples (``torch.testing._internal.common_modules.module_db``) for the modules
tunekit replaces: ``nn.Linear``, ``nn.RMSNorm``, ``nn.SiLU``, ``nn.GELU`` against ``tunekit.nn``'s, built
with each sample's constructor arguments and torch's module's state loaded: the same state_dict keys
and shapes, repr, outputs within tolerance, and the same gradients for the inputs and every parameter.
"""

import pytest
import torch

pytest.importorskip("expecttest")
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

import tunekit  # noqa: E402
from opinfo_db import module_db  # noqa: E402
from tunekit.tunable.numerics import compare, tolerance  # noqa: E402


OURS = {torch.nn.Linear: tunekit.nn.Linear, torch.nn.RMSNorm: tunekit.nn.RMSNorm, torch.nn.SiLU: tunekit.nn.SiLU,
        torch.nn.GELU: tunekit.nn.GELU}
INFOS = [m for m in module_db() if m.module_cls in OURS]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _leaves(args) -> list:
    return [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("info", INFOS, ids=lambda m: m.module_cls.__name__)
def test_module_samples_match_torchs_module(info, dtype, device):
    rtol, atol = tolerance(dtype)
    tol = (2 * rtol, 16 * atol)
    samples = info.module_inputs_func(info, device=device, dtype=dtype, requires_grad=True, training=True)
    assert samples, info.module_cls
    for i, sample in enumerate(samples):
        c = sample.constructor_input
        theirs = info.module_cls(*c.args, **c.kwargs).to(device=device, dtype=dtype)
        ours = OURS[info.module_cls](*c.args, **c.kwargs).to(device=device, dtype=dtype)
        ours.load_state_dict(theirs.state_dict())
        what = f"{info.module_cls.__name__} sample {i} {c.args} {c.kwargs}"
        assert repr(ours) == repr(theirs), what
        assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
        f = sample.forward_input
        args_t = [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in f.args]
        args_o = [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in f.args]
        y_t, y_o = theirs(*args_t, **f.kwargs), ours(*args_o, **f.kwargs)
        assert (y_o.shape, y_o.dtype) == (y_t.shape, y_t.dtype), what
        assert compare(y_o, y_t, tol) is None, f"{what}: {compare(y_o, y_t, tol)}"
        wrt_t, wrt_o = _leaves(args_t) + list(theirs.parameters()), _leaves(args_o) + list(ours.parameters())
        if not wrt_t:
            continue
        dy = torch.randn_like(y_t)
        for j, (g_o, g_t) in enumerate(zip(torch.autograd.grad(y_o, wrt_o, dy), torch.autograd.grad(y_t, wrt_t, dy))):
            assert compare(g_o, g_t, tol) is None, f"{what} gradient {j}: {compare(g_o, g_t, tol)}"
