#!/usr/bin/env bash
# Ground truth of the `megatron` suite: presets/workloads/megatron_gpt.py (Megatron-core 0.16.1, the local layer spec,
# bf16, Adam, clip-grad 1.0) on 1 or 2 real GPUs of one host: TP 2, PP 2 (1F1B and interleaved), DP 2 with Megatron's
# DDP and the distributed optimizer, recompute none / selective / full.
# Run from the repository root on a host with the GPUs:  bash groundtruth/megatron/measure.sh OUT_DIR PART
# PART 1: the 1-GPU rows and the TP rows; PART 2: the PP and DP rows. Each configuration writes OUT_DIR/<name>.json
# (the workload's SUMMARY) and OUT_DIR/<name>.log.
set -u
OUT=${1:?output directory}
PART=${2:?part: 1 or 2}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
  python -c "import megatron.core as m; print('megatron-core', m.__version__)"
} > "$OUT/system-$PART.txt" 2>&1
run() {
  name=$1; n=$2; shift 2
  devices=0; [ "$n" = 2 ] && devices=0,1
  CUDA_VISIBLE_DEVICES=$devices torchrun --standalone --nproc-per-node "$n" presets/workloads/megatron_gpt.py \
    --steps 8 --json-out "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep -o '"median_step_s": [0-9.]*' "$OUT/$name.json" 2>/dev/null)"
}
if [ "$PART" = 1 ]; then
  run g1-llama3.2-1b-s2048-mb2-gb8              1 --model llama3.2-1b --seq 2048 --micro-batch 2 --global-batch 8
  run g1-llama3.2-1b-s4096-mb1-gb4-rc-full      1 --model llama3.2-1b --seq 4096 --micro-batch 1 --global-batch 4 --recompute full
  run tp2-llama3-8b-l8-s4096-mb1-gb4            2 --model llama3-8b --layers 8 --tp 2 --seq 4096 --global-batch 4
  run tp2-llama3-8b-l8-s4096-mb1-gb4-rc-sel     2 --model llama3-8b --layers 8 --tp 2 --seq 4096 --global-batch 4 --recompute selective
  run tp2-llama3.2-3b-s2048-mb2-gb8-rc-full     2 --model llama3.2-3b --tp 2 --seq 2048 --micro-batch 2 --global-batch 8 --recompute full
else
  run pp2-llama3.2-3b-s2048-mb2-gb16            2 --model llama3.2-3b --pp 2 --seq 2048 --micro-batch 2 --global-batch 16
  run pp2-vpp2-llama3.2-3b-s2048-mb2-gb16       2 --model llama3.2-3b --pp 2 --vpp 2 --seq 2048 --micro-batch 2 --global-batch 16
  run dp2-distopt-llama3.2-1b-s2048-mb2-gb16    2 --model llama3.2-1b --seq 2048 --micro-batch 2 --global-batch 16 --distributed-optimizer --overlap-grad-reduce --overlap-param-gather
  run dp2-distopt-llama3.2-3b-s4096-mb1-gb8-rc-full 2 --model llama3.2-3b --seq 4096 --micro-batch 1 --global-batch 8 --distributed-optimizer --overlap-grad-reduce --recompute full
  run dp2-ddp-llama3.2-1b-s2048-mb2-gb8         2 --model llama3.2-1b --seq 2048 --micro-batch 2 --global-batch 8
fi
