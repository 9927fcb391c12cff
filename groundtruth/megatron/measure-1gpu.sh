#!/usr/bin/env bash
# The `megatron` suite's one-GPU rows on a one-GPU host (1 x H100 80GB): presets/workloads/megatron_gpt.py as in
# measure.sh. Run from the repository root:  bash groundtruth/megatron/measure-1gpu.sh OUT_DIR
set -u
OUT=${1:?output directory}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
  python -c "import megatron.core as m; print('megatron-core', m.__version__)"
} > "$OUT/system.txt" 2>&1
run() {
  name=$1; shift
  torchrun --standalone --nproc-per-node 1 presets/workloads/megatron_gpt.py --steps 8 --json-out "$OUT/$name.json" \
    "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep -o '"median_step_s": [0-9.]*' "$OUT/$name.json" 2>/dev/null)"
}
run g1-llama3.2-1b-s2048-mb2-gb8              --model llama3.2-1b --seq 2048 --micro-batch 2 --global-batch 8
run g1-llama3.2-1b-s4096-mb1-gb4-rc-full      --model llama3.2-1b --seq 4096 --micro-batch 1 --global-batch 4 --recompute full
run g1-llama3.2-3b-s2048-mb1-gb4-rc-sel       --model llama3.2-3b --seq 2048 --micro-batch 1 --global-batch 4 --recompute selective
run g1-llama3-8b-l8-s4096-mb1-gb2-rc-full     --model llama3-8b --layers 8 --seq 4096 --micro-batch 1 --global-batch 2 --recompute full
