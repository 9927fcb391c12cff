#!/usr/bin/env bash
# FSDP without a second GPU: the same per-GPU step on one GPU as a plain bf16 model and as FSDP2 over a world of
# one (`--shard-one-rank`: fp32 shards, bf16 compute, fp32 gradient reduction, no peer), rank 0's kernels and ops
# recorded (--kernel-profile). Separates what FSDP changes on a GPU (mixed precision casts, the unsharded
# parameters' buffers) from what a second GPU changes (fsdp_rows.sh).
# Run from the repository root on a host with one GPU:  bash groundtruth/insitu/fsdp_one_rank.sh OUT_DIR
set -u
OUT=${1:?output directory}
mkdir -p "$OUT"
run() {
  name=$1; shift
  torchrun --standalone --nproc-per-node 1 presets/workloads/llama.py --steps 6 --kernel-profile "$OUT/$name" \
    --json-out "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep -o '"median_step_s": [0-9.]*' "$OUT/$name.json" 2>/dev/null)"
}
run 1b-g1-s2048-b8 --model llama3.2-1b --seq 2048 --batch 8 --ac none
run 1b-fsdp1-s2048-b8 --model llama3.2-1b --dp-mode fsdp --shard-one-rank --seq 2048 --batch 8 --ac none
run 3b-g1-s4096-b2-sel --model llama3.2-3b --seq 4096 --batch 2 --ac selective
run 3b-fsdp1-s4096-b2-sel --model llama3.2-3b --dp-mode fsdp --shard-one-rank --seq 4096 --batch 2 --ac selective
