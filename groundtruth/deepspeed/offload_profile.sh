#!/usr/bin/env bash
# Where the host time of the two-GPU ZeRO-Offload row goes (h200-2-dp2-z2-llama3.2-1b-s2048-mb2-offload: DeepSpeed's
# CPU Adam with one thread per rank, as torchrun sets OMP_NUM_THREADS=1 for 2 processes). py-spy samples the Python
# stacks of both ranks (non-blocking, read only; nothing on the GPU is changed). A first run builds DeepSpeed's CPU
# Adam (JIT, cached), so the sampled run's stacks are of loading and training only.
# Run from the repository root on a host with DeepSpeed and py-spy installed:
#   bash groundtruth/deepspeed/offload_profile.sh OUT_DIR [GPUS]
# GPUS is 2 (the default: the two-GPU row) or 1 (h200-1-g1-z2-llama3.2-1b-s2048-mb2-offload, OMP_NUM_THREADS unset as
# torchrun leaves it for one process: the CPU Adam on every core).
# Writes OUT_DIR/warmup.log, offload.log, offload.json (the workload's SUMMARY) and offload-raw.txt (py-spy's
# collapsed stacks, one line per distinct stack with its sample count). Summarize with offload_stacks.py. With one
# GPU also two plain runs of 10 steps without the sampler: plain.json / plain.log (threads as in the record) and
# plain-omp16.json / .log (OMP_NUM_THREADS=16, half the cores).
set -u
OUT=${1:?output directory}
GPUS=${2:-2}
mkdir -p "$OUT"
ARGS="--model llama3.2-1b --zero 2 --micro-batch 2 --offload-optimizer cpu"
RUN="torchrun --standalone --nproc-per-node $GPUS presets/workloads/deepspeed_gpt.py $ARGS"
# one process: OMP_NUM_THREADS unset, as in the record (torchrun leaves a caller's value to a single process)
[ "$GPUS" = 1 ] && RUN="env -u OMP_NUM_THREADS $RUN"
$RUN --steps 3 > "$OUT/warmup.log" 2>&1
echo "warmup rc=$?"
if [ "$GPUS" = 1 ]; then
  $RUN --steps 10 --json-out "$OUT/plain.json" > "$OUT/plain.log" 2>&1
  echo "plain rc=$? $(grep -o '"median_step_s": [0-9.]*' "$OUT/plain.json" 2>/dev/null)"
  OMP_NUM_THREADS=16 ${RUN#env -u OMP_NUM_THREADS } --steps 10 --json-out "$OUT/plain-omp16.json" \
    > "$OUT/plain-omp16.log" 2>&1
  echo "plain OMP_NUM_THREADS=16 rc=$? $(grep -o '"median_step_s": [0-9.]*' "$OUT/plain-omp16.json" 2>/dev/null)"
fi
py-spy record --subprocesses --threads --nonblocking --rate 200 --format raw --output "$OUT/offload-raw.txt" -- \
  $RUN --steps 10 --json-out "$OUT/offload.json" > "$OUT/offload.log" 2>&1
echo "profiled rc=$? $(grep -o '"median_step_s": [0-9.]*' "$OUT/offload.json" 2>/dev/null)"
{ nproc; echo "OMP_NUM_THREADS of the caller: ${OMP_NUM_THREADS-unset}"; lscpu | grep -E "Model name|^CPU\(s\)"
} > "$OUT/system.txt"
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv >> "$OUT/system.txt"
