#!/usr/bin/env bash
# The `local` suite's two-GPU FSDP rows measured in situ: each row's configuration on 2 x H200 with FSDP2 (and the
# 1B one also with DDP at batch 4, and on one GPU at batch 8), rank 0's kernels and aten ops recorded
# (--kernel-profile: steps 3-4). Compare a simulated trace of the same command with compare_sim.py.
# Run from the repository root on a 2-GPU host:  bash groundtruth/insitu/fsdp_rows.sh OUT_DIR
set -u
OUT=${1:?output directory}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
} > "$OUT/system.txt" 2>&1
run() {
  name=$1; n=$2; shift 2
  env CUDA_VISIBLE_DEVICES=$( [ "$n" = 1 ] && echo 0 || echo 0,1 ) torchrun --standalone --nproc-per-node $n \
    presets/workloads/llama.py --steps 6 --kernel-profile "$OUT/$name" --json-out "$OUT/$name.json" "$@" \
    > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep -o '"median_step_s": [0-9.]*' "$OUT/$name.json" 2>/dev/null)"
}
run 1b-g1-s2048-b8 1 --model llama3.2-1b --seq 2048 --batch 8 --ac none
run 1b-fsdp2-s2048-b8 2 --model llama3.2-1b --dp-mode fsdp --seq 2048 --batch 8 --ac none
run 1b-ddp2-s2048-b4 2 --model llama3.2-1b --dp-mode ddp --seq 2048 --batch 4 --ac none
run 3b-fsdp2-s4096-b2-sel 2 --model llama3.2-3b --dp-mode fsdp --seq 4096 --batch 2 --ac selective
run 3b-g1-s4096-b2-sel 1 --model llama3.2-3b --seq 4096 --batch 2 --ac selective
run 8b-fsdp2-s2048-b4-full 2 --model llama3-8b --dp-mode fsdp --seq 2048 --batch 4 --ac full
