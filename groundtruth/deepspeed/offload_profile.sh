#!/usr/bin/env bash
# Where the host time of the two-GPU ZeRO-Offload row goes (h200-2-dp2-z2-llama3.2-1b-s2048-mb2-offload: DeepSpeed's
# CPU Adam with one thread per rank, as torchrun sets OMP_NUM_THREADS=1 for 2 processes). py-spy samples the Python
# stacks of both ranks (non-blocking, read only; nothing on the GPU is changed). A first run builds DeepSpeed's CPU
# Adam (JIT, cached), so the sampled run's stacks are of loading and training only.
# Run from the repository root on a 2-GPU host with DeepSpeed and py-spy installed:
#   bash groundtruth/deepspeed/offload_profile.sh OUT_DIR
# Writes OUT_DIR/warmup.log, offload.log, offload.json (the workload's SUMMARY) and offload-raw.txt (py-spy's
# collapsed stacks, one line per distinct stack with its sample count). Summarize with offload_stacks.py.
set -u
OUT=${1:?output directory}
mkdir -p "$OUT"
ARGS="--model llama3.2-1b --zero 2 --micro-batch 2 --offload-optimizer cpu"
torchrun --standalone --nproc-per-node 2 presets/workloads/deepspeed_gpt.py $ARGS --steps 3 > "$OUT/warmup.log" 2>&1
echo "warmup rc=$?"
py-spy record --subprocesses --threads --nonblocking --rate 200 --format raw --output "$OUT/offload-raw.txt" -- \
  torchrun --standalone --nproc-per-node 2 presets/workloads/deepspeed_gpt.py $ARGS --steps 10 \
  --json-out "$OUT/offload.json" > "$OUT/offload.log" 2>&1
echo "profiled rc=$? $(grep -o '"median_step_s": [0-9.]*' "$OUT/offload.json" 2>/dev/null)"
