#!/usr/bin/env bash
# SM clock, power, temperature and throttle reasons (NVML through nvidia-smi, read only) sampled every 100 ms while
# the same per-GPU FSDP step runs on one GPU and on two (8 layers of Llama 3 8B, seq 4096, batch 2, no AC).
# Run from the repository root on a 2-GPU host:  bash groundtruth/insitu/clocks.sh OUT_DIR
set -u
OUT=${1:?output directory}
mkdir -p "$OUT"
Q=timestamp,index,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,utilization.gpu,memory.used,clocks_throttle_reasons.active
for n in 1 2; do
  nvidia-smi --query-gpu=$Q --format=csv,nounits -lms 100 > "$OUT/nvml-g$n.csv" &
  SMI=$!
  torchrun --standalone --nproc-per-node $n presets/workloads/llama.py --model llama3-8b --layers 8 --seq 4096 \
    --batch 2 --ac none --steps 20 --json-out "$OUT/step-g$n.json" > "$OUT/step-g$n.log" 2>&1
  echo "g$n rc=$?"
  kill $SMI
  sleep 3
done
