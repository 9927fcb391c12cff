#!/usr/bin/env bash
# Python lines per step on a real GPU host (line_count.py), for the host-CPU model's host-bound outliers: DeepSpeed
# ZeRO-3 (the `deepspeed` suite's one-GPU 1B row), ZeRO-2 beside it, and the reference workload's llama-tiny step
# the line price was fitted on (groundtruth/hostcpu/measure.sh, g1-fsdp-none). Each configuration runs with two step
# counts; lines per step = the difference of the totals over the difference of the steps.
# Run from the repository root on a host with one GPU:  bash groundtruth/hostcpu/line_count.sh OUT_DIR
set -u
OUT=${1:?output directory}
mkdir -p "$OUT"
count() {
  name=$1; steps=$2; shift 2
  CUDA_VISIBLE_DEVICES=0 timeout 280 torchrun --standalone --nproc-per-node 1 groundtruth/hostcpu/line_count.py \
    "$OUT/$name-s$steps.json" -- "$@" --steps "$steps" > "$OUT/$name-s$steps.log" 2>&1
  echo "$name steps $steps rc=$? $(cat "$OUT/$name-s$steps.json" 2>/dev/null)"
}
T="presets/workloads/llama.py --model llama-tiny --seq 256 --batch 1 --ac none"
[ -n "${SKIP_TINY:-}" ] || count tiny-g1 4 $T
[ -n "${SKIP_TINY:-}" ] || count tiny-g1 8 $T
export TORCH_CUDA_ARCH_LIST=9.0       # FusedAdam is JIT-compiled on the host, as in groundtruth/deepspeed/
D="presets/workloads/deepspeed_gpt.py --model llama3.2-1b --micro-batch 2"
count z3-1b-ac 3 $D --zero 3 --ac full
count z3-1b-ac 6 $D --zero 3 --ac full
count z2-1b 3 $D --zero 2
count z2-1b 6 $D --zero 2
