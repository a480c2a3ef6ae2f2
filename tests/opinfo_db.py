"""torch's OpInfo database for the conformance tests (``tests/ops/test_opinfo*.py``), imported without
the environment change its import makes (an Inductor cache dir). Needs ``expecttest``: the tests
skip themselves before importing this module without it."""

import os

import torch


def _op_db():
    saved = dict(os.environ)
    from torch.testing._internal.common_dtype import all_types_and_complex_and
    from torch.testing._internal.common_methods_invocations import op_db
    for key in set(os.environ) - set(saved):
        del os.environ[key]
    os.environ.update({k: v for k, v in saved.items() if os.environ.get(k) != v})
    return op_db, set(all_types_and_complex_and(torch.half, torch.bfloat16, torch.bool))


#: every OpInfo; every dtype OpInfos cover (floats, integers, bool, complex)
OP_DB, ALL_DTYPES = _op_db()
