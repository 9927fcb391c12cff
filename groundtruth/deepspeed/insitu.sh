#!/usr/bin/env bash
# In-situ kernel timelines of the `deepspeed` suite's rows that the simulation misses by more than 5%: the pipeline
# engine's two rows (every rank recorded: the stages run different layers) and the host-bound ZeRO-3 rows.
# Run from the repository root on a host of 2 GPUs:  bash groundtruth/deepspeed/insitu.sh OUT_DIR
# Each row writes OUT_DIR/<name>.json (the workload's SUMMARY), OUT_DIR/<name>.log and, for steps 3-4,
# OUT_DIR/<name>/{ops,kernels,timeline}.json (rank 0) and OUT_DIR/<name>/rank1/ (presets/workloads/workload_common.py).
set -u
OUT=${1:?output directory}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
  python -c "import deepspeed; print('deepspeed', deepspeed.__version__)"
  nproc
} > "$OUT/system.txt" 2>&1
run() {
  name=$1; n=$2; shift 2
  devices=0; [ "$n" = 2 ] && devices=0,1
  CUDA_VISIBLE_DEVICES=$devices torchrun --standalone --nproc-per-node "$n" presets/workloads/deepspeed_gpt.py \
    --steps 8 --json-out "$OUT/$name.json" --kernel-profile "$OUT/$name" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep -o '"median_step_s": [0-9.]*' "$OUT/$name.json" 2>/dev/null)"
}
run pp2-z1-llama3.2-3b-s2048-mb1-ga8        2 --model llama3.2-3b --pp 2 --zero 1 --grad-accum 8
run pp2-z1-llama3.2-1b-s2048-mb2-ga8-ac     2 --model llama3.2-1b --pp 2 --zero 1 --micro-batch 2 --grad-accum 8 --ac full
run dp2-z3-llama3.2-1b-s2048-mb2            2 --model llama3.2-1b --zero 3 --micro-batch 2
run g1-z3-llama3.2-1b-s2048-mb2-ac          1 --model llama3.2-1b --zero 3 --micro-batch 2 --ac full
