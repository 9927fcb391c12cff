#!/usr/bin/env bash
# The two-GPU FSDP compute slowdown under NCCL settings: the same per-GPU step (Llama 3 8B cut to 8 layers, seq 4096,
# batch 2, no AC) on one GPU and on two with FSDP2, the two-GPU run repeated with NCCL's NVLink peer-to-peer transport
# off (NCCL_P2P_DISABLE=1: through host shared memory), with the Simple protocol only, and with at most 2 channels;
# rank 0's kernels recorded in situ (--kernel-profile) each time. Compare with compare_kernels.py --alone.
# Run from the repository root on a 2-GPU host:  bash groundtruth/insitu/nccl_variants.sh OUT_DIR
set -u
OUT=${1:?output directory}
mkdir -p "$OUT"
ARGS="--model llama3-8b --layers 8 --seq 4096 --batch 2 --ac none --steps 6"
run() {
  name=$1; n=$2; shift 2
  env "$@" torchrun --standalone --nproc-per-node $n presets/workloads/llama.py $ARGS --kernel-profile "$OUT/$name" \
    --json-out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep -o '"median_step_s": [0-9.]*' "$OUT/$name.json" 2>/dev/null)"
}
run g1 1 CUDA_VISIBLE_DEVICES=0
run g2-default 2 NCCL_DEBUG=WARN
run g2-nop2p 2 NCCL_P2P_DISABLE=1
run g2-simple 2 NCCL_PROTO=Simple
run g2-ch2 2 NCCL_MAX_NCHANNELS=2
