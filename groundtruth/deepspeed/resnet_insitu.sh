#!/usr/bin/env bash
# Where the ResNet-50 rows' steps go on the GPU: the `deepspeed` suite's two ResNet-50 rows (ZeRO 1, batch 128 per
# GPU) on a host of 2 GPUs, each twice: 8 plain steps (the step time on this host) and 8 steps with steps 3-4
# recorded by torch.profiler (--kernel-profile: OUT_DIR/<name>-prof/{ops,kernels,launchers,timeline}.json, rank 0),
# the Python stacks of the launching ops included (KERNEL_PROFILE_STACKS=1).
# Run from the repository root on a host of 2 GPUs:  bash groundtruth/deepspeed/resnet_insitu.sh OUT_DIR
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
  CUDA_VISIBLE_DEVICES=$devices torchrun --standalone --nproc-per-node "$n" presets/workloads/deepspeed_resnet.py \
    --steps 8 --batch 128 --zero 1 --json-out "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep -o '"median_step_s": [0-9.]*' "$OUT/$name.json" 2>/dev/null)"
}
run g1-z1-resnet50-b128 1
KERNEL_PROFILE_STACKS=1 run g1-z1-resnet50-b128-prof 1 --kernel-profile "$OUT/g1-z1-resnet50-b128-prof"
run dp2-z1-resnet50-b128 2
KERNEL_PROFILE_STACKS=1 run dp2-z1-resnet50-b128-prof 2 --kernel-profile "$OUT/dp2-z1-resnet50-b128-prof"
