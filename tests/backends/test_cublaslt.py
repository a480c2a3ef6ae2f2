"""cuBLASLt through ctypes (backends/cublaslt.py): how a torch operand reads column-major, why the
library is unavailable on a machine without CUDA, and on a GPU the plans and calls themselves."""

import pytest
import torch

from tunekit.backends import cublaslt

OP_N, OP_T = 0, 1


def test_row_major_operands_read_as_their_transpose_and_column_major_ones_as_themselves():
    a = torch.empty(6, 10)
    assert cublaslt.operand_layout(a) == (OP_N, 10, 6, 10)
    assert cublaslt.operand_layout(a.t()) == (OP_T, 10, 6, 10)  # [10, 6] column-major: itself, read transposed
    assert cublaslt.operand_layout(torch.empty(1, 7)) == (OP_N, 7, 1, 7)
    assert cublaslt.operand_layout(torch.empty(7, 1)) == (OP_N, 1, 7, 1)
    assert cublaslt.operand_layout(torch.empty(7, 12)[:, :10]) is None  # a padded leading dimension
    assert cublaslt.operand_layout(torch.empty(7, 20)[:, ::2]) is None  # no unit stride


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only answer")
def test_unavailable_without_cuda_says_why():
    assert "CUDA" in cublaslt.unavailable()


@pytest.mark.gpu
def test_plans_are_made_once_per_problem_and_rank_the_heuristics_algorithms():
    a = torch.randn(64, 96, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(48, 96, device="cuda", dtype=torch.bfloat16).t()
    plan = cublaslt.plan_for(a, b, False)
    assert cublaslt.plan_for(a.clone(), b, False) is plan  # same problem, same alignment
    assert cublaslt.plan_for(a, b.contiguous(), False) is not plan  # another layout of B
    assert 1 <= plan.algorithms <= cublaslt.MAX_ALGORITHMS
    out = torch.full((64, 48), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert cublaslt.matmul(plan, 0, a, b, out) is out
    torch.testing.assert_close(out.float(), a.float() @ b.float(), rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match="offers"):
        cublaslt.matmul(plan, plan.algorithms, a, b, out)
