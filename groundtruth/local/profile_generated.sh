#!/bin/bash
# Time the kernels Inductor generated in compiled traces (their recipes: docs/compile.md) on this host's GPU, into a
# copy of the GPU's profile database.
#   bash groundtruth/local/profile_generated.sh GPU_PRESET OUT_DIR TRACE...
# OUT_DIR gets system.txt, <GPU_PRESET>.h5 (presets/profiles/<GPU_PRESET>.h5 with the new records merged in) and
# generated-<GPU_PRESET>.log (one line per signature: the median in µs, or why it was skipped or failed).
set -u
GPU=$1; OUT=$2; shift 2
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$OUT/system.txt" 2>&1
cp "presets/profiles/$GPU.h5" "$OUT/$GPU.h5"
PYTHONPATH=. python -m phantora.cli profile "$@" --out "$OUT/$GPU.h5" --gpu "$GPU" \
  --op inductor.pointwise --op inductor.reduction --iters 20 2>&1 | tee "$OUT/generated-$GPU.log"
