"""torch's OpInfo and ModuleInfo databases for the conformance tests (``tests/ops/test_opinfo*.py``,
``tests/test_nn_moduleinfo.py``), imported without the environment change their import makes (an
Inductor cache dir). Needs ``expecttest``: the tests skip themselves before importing this module
without it."""

import os

import torch


def _keeping_environment(load):
    saved = dict(os.environ)
    try:
        return load()
    finally:
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        os.environ.update({k: v for k, v in saved.items() if os.environ.get(k) != v})


def _op_db():
    from torch.testing._internal.common_dtype import all_types_and_complex_and
    from torch.testing._internal.common_methods_invocations import op_db
    return op_db, set(all_types_and_complex_and(torch.half, torch.bfloat16, torch.bool))


def module_db() -> list:
    """Every ModuleInfo."""
    def load():
        from torch.testing._internal.common_modules import module_db
        return module_db
    return _keeping_environment(load)


#: every OpInfo; every dtype OpInfos cover (floats, integers, bool, complex)
OP_DB, ALL_DTYPES = _keeping_environment(_op_db)
