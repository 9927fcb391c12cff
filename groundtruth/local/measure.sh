#!/usr/bin/env bash
# Ground truth of the `local` suite: the reference workload (presets/workloads/llama.py) on real GPUs.
# Run from the repository root on a host with the GPUs:  bash groundtruth/local/measure.sh OUT_DIR NGPUS
# Each configuration writes OUT_DIR/<name>.json (the workload's SUMMARY) and OUT_DIR/<name>.log.
set -u
OUT=${1:?output directory}
N=${2:-2}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/system.txt"
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())" >> "$OUT/system.txt"
run() {
  name=$1; shift
  torchrun --standalone --nproc-per-node "$N" presets/workloads/llama.py --steps 8 --json-out "$OUT/$name.json" "$@" \
    > "$OUT/$name.log" 2>&1
  echo "$name rc=$?"
}
run llama3-8b-fsdp${N}-s4096-b1-ac-none   --model llama3-8b --dp-mode fsdp --seq 4096 --batch 1 --ac none
run llama3-8b-fsdp${N}-s8192-b1-ac-sel    --model llama3-8b --dp-mode fsdp --seq 8192 --batch 1 --ac selective
run llama3-8b-fsdp${N}-s4096-b2-ac-full   --model llama3-8b --dp-mode fsdp --seq 4096 --batch 2 --ac full
run llama3-8b-tp${N}-s4096-b1-ac-none     --model llama3-8b --tp "$N" --seq 4096 --batch 1 --ac none
