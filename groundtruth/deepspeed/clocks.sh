#!/usr/bin/env bash
# SM clock, power and throttle reasons (NVML through nvidia-smi, read only, every 100 ms) while the `deepspeed`
# suite's pipeline-engine rows, its host-bound ZeRO-3 rows and one GPU-bound ZeRO-2 row run 12 steps each, without
# a profiler (the step times are those of an undisturbed run).
# Run from the repository root on a host of 2 GPUs:  bash groundtruth/deepspeed/clocks.sh OUT_DIR
# Each row writes OUT_DIR/<name>.json (the workload's SUMMARY), OUT_DIR/<name>.log and OUT_DIR/<name>.csv (samples).
set -u
OUT=${1:?output directory}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
  python -c "import deepspeed; print('deepspeed', deepspeed.__version__)"
  nproc; lscpu | grep -i "model name"
} > "$OUT/system.txt" 2>&1
Q=timestamp,index,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,utilization.gpu,clocks_throttle_reasons.active
run() {
  name=$1; n=$2; shift 2
  devices=0; [ "$n" = 2 ] && devices=0,1
  nvidia-smi --query-gpu=$Q --format=csv,nounits -lms 100 > "$OUT/$name.csv" &
  SMI=$!
  CUDA_VISIBLE_DEVICES=$devices torchrun --standalone --nproc-per-node "$n" presets/workloads/deepspeed_gpt.py \
    --steps 12 --json-out "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep -o '"median_step_s": [0-9.]*' "$OUT/$name.json" 2>/dev/null)"
  kill $SMI
  sleep 2
}
run pp2-z1-llama3.2-3b-s2048-mb1-ga8        2 --model llama3.2-3b --pp 2 --zero 1 --grad-accum 8
run pp2-z1-llama3.2-1b-s2048-mb2-ga8-ac     2 --model llama3.2-1b --pp 2 --zero 1 --micro-batch 2 --grad-accum 8 --ac full
run dp2-z3-llama3.2-1b-s2048-mb2            2 --model llama3.2-1b --zero 3 --micro-batch 2
run g1-z3-llama3.2-1b-s2048-mb2-ac          1 --model llama3.2-1b --zero 3 --micro-batch 2 --ac full
run dp2-z2-llama3.2-3b-s4096-mb1-ac         2 --model llama3.2-3b --zero 2 --seq 4096 --ac full
