#!/usr/bin/env bash
# Device calls, each under the device's 10-minute limit (outputs under $OUT when set):
#   bash scripts/gpu_check.sh tests   GPU facts, pytest -m gpu, the rest of the suite, dispatch and launch overhead
#   bash scripts/gpu_check.sh bench   benchmarks/suites/activations.py (every candidate, torch eager, torch.compile),
#                                     logsumexp.py, copy_ceiling.py, the first-call tuning time, model_step.py
set -uo pipefail
OUT=${OUT:-/tmp/tunekit-out}; mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1 TUNEKIT_RESULTS=/tmp/tunekit-results.sqlite
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
case "${1:-tests}" in
tests)
  echo "== pytest -m gpu"; python3 -m pytest -q -m gpu -p no:cacheprovider 2>&1 | tee "$OUT/pytest-gpu.txt" | tail -25
  echo "== pytest -m 'not gpu'"; python3 -m pytest -q -m "not gpu" -p no:cacheprovider 2>&1 | tee "$OUT/pytest-cpu.txt" | tail -4
  echo "== dispatch overhead"; python3 benchmarks/suites/dispatch_overhead.py --save 2>&1 | tee "$OUT/dispatch.txt"
  cp benchmarks/results/dispatch_overhead-*.md "$OUT/" 2>/dev/null
  echo "== launch overhead"; python3 benchmarks/suites/launch_overhead.py 2>&1 | tee "$OUT/launch_overhead.md" ;;
bench)
  echo "== activations"; python3 benchmarks/suites/activations.py --out "$OUT" "${@:2}" 2>&1 | tee "$OUT/activations.txt" | tail -60
  echo "== logsumexp"; python3 benchmarks/suites/logsumexp.py --out "$OUT" 2>&1 | tail -3
  echo "== copy ceiling"; python3 benchmarks/ceilings/copy_ceiling.py --out "$OUT" 2>&1 | tail -4
  echo "== tuning time of a new signature"; python3 benchmarks/suites/tuning_time.py 2>&1 | tee "$OUT/tuning_time.md"
  echo "== model step"; python3 benchmarks/suites/model_step.py --out "$OUT" 2>&1 | tail -12 ;;
esac
