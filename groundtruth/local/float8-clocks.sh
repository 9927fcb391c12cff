#!/usr/bin/env bash
# SM clock, power and throttle reasons (NVML through nvidia-smi, read only, every 100 ms) while the `local` suite's
# two-GPU Float8 rows run 12 steps each without a profiler, and the bf16 compiled 8B row beside them for comparison.
# Needs torchao. Run from the repository root on a host of 2 GPUs:  bash groundtruth/local/float8-clocks.sh OUT_DIR
# Each row writes OUT_DIR/<name>.json (the workload's SUMMARY), OUT_DIR/<name>.log and OUT_DIR/<name>.csv (samples).
set -u
OUT=${1:?output directory}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv
  python -c "import torch, torchao; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'torchao', torchao.__version__)"
  nproc; lscpu | grep -i "model name"
} > "$OUT/system.txt" 2>&1
Q=timestamp,index,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,utilization.gpu,clocks_throttle_reasons.active
run() {
  name=$1; shift
  nvidia-smi --query-gpu=$Q --format=csv,nounits -lms 100 > "$OUT/$name.csv" &
  SMI=$!
  torchrun --standalone --nproc-per-node 2 presets/workloads/llama.py --steps 12 --json-out "$OUT/$name.json" "$@" \
    > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep -o '"median_step_s": [0-9.]*' "$OUT/$name.json" 2>/dev/null)"
  kill $SMI
  sleep 2
}
F="--dp-mode fsdp --compile"
run llama3-8b-fsdp2-s4096-b1-ac-none-compile-f8t    --model llama3-8b $F --seq 4096 --batch 1 --ac none --float8 tensorwise
run llama3-8b-fsdp2-s4096-b1-ac-none-compile-f8r    --model llama3-8b $F --seq 4096 --batch 1 --ac none --float8 rowwise
run llama3-8b-fsdp2-s4096-b1-ac-none-compile        --model llama3-8b $F --seq 4096 --batch 1 --ac none
run llama3.2-3b-fsdp2-s4096-b2-ac-sel-compile-f8t   --model llama3.2-3b $F --seq 4096 --batch 2 --ac selective \
    --float8 tensorwise
