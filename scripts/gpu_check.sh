#!/usr/bin/env bash
# One device call: GPU tests, the whole suite, and the benchmarks this issue reports.
# Usage on the device machine: bash scripts/gpu_check.sh   (writes logs under $OUT when set)
set -uo pipefail
OUT=${OUT:-/tmp/tunekit-out}; mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1 TUNEKIT_RESULTS=/tmp/tunekit-results.sqlite
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
echo "== pytest -m gpu"; python3 -m pytest -q -m gpu -p no:cacheprovider 2>&1 | tee "$OUT/pytest-gpu.txt" | tail -15
echo "== pytest (all)"; python3 -m pytest -q -p no:cacheprovider -x 2>&1 | tee "$OUT/pytest-all.txt" | tail -4
echo "== dispatch overhead"; python3 benchmarks/dispatch_overhead.py --save 2>&1 | tee "$OUT/dispatch.txt"
cp benchmarks/results/dispatch_overhead-*.md "$OUT/" 2>/dev/null
echo "== explore"
for dt in float32 float16 bfloat16; do for shape in 4096x4096 8192x8192; do
  python3 -m tunekit explore silu --shape $shape --dtype $dt 2>&1 | tee -a "$OUT/explore.txt"
done; done
echo "== tuning time of a new signature"
python3 benchmarks/tuning_time.py 2>&1 | tee "$OUT/tuning_time.txt"
