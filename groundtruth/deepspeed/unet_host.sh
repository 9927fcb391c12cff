#!/usr/bin/env bash
# Where the one-GPU rows' steps go on the host (groundtruth/deepspeed/README.md, "The one-GPU UNet row, phase by
# phase"): h200-1-g1-z1-unet-sd15-b8 (SD 1.5 UNet, 8 latents, ZeRO 1) and, for its optimizer step, the one-GPU
# ResNet-50 row, on one GPU. Writes to OUT_DIR:
#   g1-z1-unet-sd15-b8.json/.log, -r2.json/.log   the row, 20 steps, twice (measure.sh PART 4)
#   g1-z1-unet-sd15-b8-prof2.json/.log, -prof2/   steps 3-4 under torch.profiler: GPU time per op and kernel, host
#                                                 time per op (host_ops.json)
#   g1-unet-wcb.json/.log, g1-resnet-wcb.json/.log  12 steps with DeepSpeed's wall_clock_breakdown: forward,
#                                                 backward and optimizer step in milliseconds, each step
#   ops-before.json/.log, ops-after.json/.log     groundtruth/hostcpu/op_costs.py before and after those runs
#   g1-z1-unet-sd15-b8-pyspy.json/.log, -pyspy.speedscope.json   12 steps under py-spy, every sample kept in time
#                                                 order; -pyspy.speedscope.json.gz the same with its paths cut
#                                                 (groundtruth/deepspeed/step_phases.py --write, which summarizes it)
# Run from the repository root on a host with a GPU, DeepSpeed, diffusers and py-spy installed:
#   bash groundtruth/deepspeed/unet_host.sh OUT_DIR
set -u
OUT=${1:?output directory}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv; nproc
  lscpu | grep -E "Model name|^CPU\(s\)"
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  python -c "import deepspeed, diffusers; print('deepspeed', deepspeed.__version__, 'diffusers', diffusers.__version__)"
} > "$OUT/system.txt" 2>&1
STEPS=20 ONLY=g1-z1-unet-sd15-b8 bash groundtruth/deepspeed/measure.sh "$OUT" 4
STEPS=20 ONLY=g1-z1-unet-sd15-b8 SUFFIX=-r2 bash groundtruth/deepspeed/measure.sh "$OUT" 4
PROFILE=1 ONLY=g1-z1-unet-sd15-b8 SUFFIX=-prof2 bash groundtruth/deepspeed/measure.sh "$OUT" 4
python groundtruth/hostcpu/op_costs.py "$OUT/ops-before.json" > "$OUT/ops-before.log" 2>&1
for row in unet resnet; do
  if [ $row = unet ]; then args="presets/workloads/deepspeed_unet.py --batch 8"
  else args="presets/workloads/deepspeed_resnet.py --batch 128"; fi
  CUDA_VISIBLE_DEVICES=0 torchrun --standalone --nproc-per-node 1 $args --zero 1 --steps 12 --wall-clock-breakdown \
    --json-out "$OUT/g1-$row-wcb.json" > "$OUT/g1-$row-wcb.log" 2>&1
  echo "g1-$row-wcb rc=$? $(grep -o '"median_step_s": [0-9.]*' "$OUT/g1-$row-wcb.json" 2>/dev/null)"
done
python groundtruth/hostcpu/op_costs.py "$OUT/ops-after.json" > "$OUT/ops-after.log" 2>&1
CUDA_VISIBLE_DEVICES=0 py-spy record --subprocesses --threads --idle --nonblocking --rate 250 --format speedscope \
  --output "$OUT/g1-z1-unet-sd15-b8-pyspy.speedscope.json" -- \
  torchrun --standalone --nproc-per-node 1 presets/workloads/deepspeed_unet.py --steps 12 --batch 8 --zero 1 \
  --json-out "$OUT/g1-z1-unet-sd15-b8-pyspy.json" > "$OUT/g1-z1-unet-sd15-b8-pyspy.log" 2>&1
echo "pyspy rc=$? $(grep -o '"median_step_s": [0-9.]*' "$OUT/g1-z1-unet-sd15-b8-pyspy.json" 2>/dev/null)"
python groundtruth/deepspeed/step_phases.py "$OUT/g1-z1-unet-sd15-b8-pyspy.speedscope.json" \
  "$OUT/g1-z1-unet-sd15-b8-pyspy.json" --write "$OUT/g1-z1-unet-sd15-b8-pyspy.speedscope.json.gz"
