#!/bin/bash
# Memory-safety check of the kernels: compute-sanitizer's memcheck over the GPU tests that run every candidate directly
# on odd sizes, misaligned and transposed views and special values. torch's caching allocator is off
# (PYTORCH_NO_CUDA_MEMORY_CACHING=1), so each tensor is an allocation of its own and a read or write past its end is
# reported, not absorbed by a neighbour in the allocator's block. Serial: under pytest-xdist the sanitized workers did
# not start within minutes. Each group has a time limit (memcheck runs the tests ~10x slower); a group cut by its limit
# reports no summary line but every error found by then. Run from the repository root on a GPU machine:
#   bash benchmarks/checks/memcheck.sh [OUT_DIR]
out=${1:-memcheck-out}
mkdir -p "$out"
export PYTHONPATH=$PWD/src:$PYTHONPATH PYTORCH_NO_CUDA_MEMORY_CACHING=1
check() {  # name, seconds, test file, -k expression
  timeout "$2" compute-sanitizer --tool memcheck --report-api-errors no --print-limit 30 --log-file "$out/$1.log" \
    python -m pytest -m gpu -q -p no:cacheprovider -p no:xdist -p no:benchmark "$3" -k "$4" > "$out/$1.pytest.log" 2>&1
  echo "$1 (exit $?): $(tail -1 "$out/$1.pytest.log" | cut -c1-100)"
  grep -h "ERROR SUMMARY" "$out/$1.log"
  grep -h -B2 -A6 "Invalid\|Misaligned\|Out-of-range" "$out/$1.log" | head -40
}
check silu_awkward 120 tests/ops/test_silu.py "awkward and not graph"
check gelu_awkward 120 tests/ops/test_gelu.py "awkward and not graph"
check logsumexp_special 120 tests/ops/test_logsumexp.py "test_every_candidate_on_special_values"
check logsumexp_backward_special 120 tests/ops/test_logsumexp.py "test_every_backward_candidate_on_special_values"
check logsumexp_backward_float64 150 tests/ops/test_logsumexp.py "test_every_backward_candidate_matches_float64"
check logsumexp_float64 300 tests/ops/test_logsumexp.py "test_every_candidate_matches_float64"
check gemm_decode 120 tests/ops/test_gemm_decode.py "not graph"
