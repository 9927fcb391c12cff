#!/usr/bin/env bash
# More ground truth of the `local` suite: the reference workload (presets/workloads/llama.py) on 1 or 2 real GPUs,
# Llama 3.2 1B / 3B and Llama 3 8B, FSDP2, TP 2, DDP, activation checkpointing none / selective / full, batch 1-8,
# sequence 2048-8192, and a pair at the out-of-memory edge on one GPU (one that fits, one that does not).
# Run from the repository root on a host with the GPUs:  bash groundtruth/local/measure2.sh OUT_DIR NGPUS
# Each configuration writes OUT_DIR/<name>.json (the workload's SUMMARY) and OUT_DIR/<name>.log.
set -u
OUT=${1:?output directory}
N=${2:?number of GPUs: 1 or 2}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
} > "$OUT/system.txt" 2>&1
run() {
  name=$1; shift
  torchrun --standalone --nproc-per-node "$N" presets/workloads/llama.py --steps 8 --json-out "$OUT/$name.json" "$@" \
    > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep -o '"median_step_s": [0-9.]*' "$OUT/$name.json" 2>/dev/null)"
}
if [ "$N" = 1 ]; then
  run llama3.2-1b-g1-s4096-b4-ac-none   --model llama3.2-1b --seq 4096 --batch 4 --ac none
  run llama3.2-1b-g1-s2048-b1-ac-none   --model llama3.2-1b --seq 2048 --batch 1 --ac none
  run llama3.2-3b-g1-s4096-b2-ac-full   --model llama3.2-3b --seq 4096 --batch 2 --ac full
  run llama3.2-3b-g1-s8192-b1-ac-none   --model llama3.2-3b --seq 8192 --batch 1 --ac none
  run llama3.2-3b-g1-s8192-b2-ac-none   --model llama3.2-3b --seq 8192 --batch 2 --ac none
else
  run llama3.2-1b-fsdp2-s2048-b8-ac-none  --model llama3.2-1b --dp-mode fsdp --seq 2048 --batch 8 --ac none
  run llama3.2-1b-tp2-s4096-b2-ac-none    --model llama3.2-1b --tp 2 --seq 4096 --batch 2 --ac none
  run llama3.2-1b-ddp2-s2048-b4-ac-none   --model llama3.2-1b --dp-mode ddp --seq 2048 --batch 4 --ac none
  run llama3.2-3b-fsdp2-s4096-b2-ac-sel   --model llama3.2-3b --dp-mode fsdp --seq 4096 --batch 2 --ac selective
  run llama3.2-3b-tp2-s8192-b1-ac-full    --model llama3.2-3b --tp 2 --seq 8192 --batch 1 --ac full
  run llama3-8b-fsdp2-s2048-b4-ac-full    --model llama3-8b --dp-mode fsdp --seq 2048 --batch 4 --ac full
  run llama3-8b-tp2-s8192-b1-ac-full      --model llama3-8b --tp 2 --seq 8192 --batch 1 --ac full
fi
