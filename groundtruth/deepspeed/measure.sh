#!/usr/bin/env bash
# Ground truth of the `deepspeed` suite: presets/workloads/deepspeed_gpt.py (Llama shapes) and deepspeed_resnet.py
# (ResNet-50) under DeepSpeed 0.19.8 with its default optimizer choice (FusedAdam, compiled on first use) on 1 or 2
# GPUs of one host: ZeRO 1/2/3, activation checkpointing, gradient accumulation, fp16 loss scaling, ZeRO-Offload.
# Run from the repository root on a host with the GPUs:  bash groundtruth/deepspeed/measure.sh OUT_DIR PART
# PART 1, 2, 3 (the pipeline-engine rows), 4 (Stable Diffusion UNet, GAT), 5 (ZeRO-Infinity's NVMe offload) and 6
# (ZeRO++) split the rows; each configuration
# writes OUT_DIR/<name>.json (the workload's SUMMARY) and OUT_DIR/<name>.log. Rows run under torchrun, which sets OMP_NUM_THREADS=1 for 2 processes (the CPU optimizer's
# threads under offload). STEPS (default 8) sets the steps of each run; ONLY (names, space-separated) runs those rows of
# the PART alone, and SUFFIX is appended to their file names (repeat runs: groundtruth/deepspeed/repeat_rows.sh).
# PROFILE=1 records steps 3-4 of each row by torch.profiler with the launching ops' Python stacks
# (--kernel-profile OUT_DIR/<name>/, rank 0; rank1/ for a second rank; presets/workloads/workload_common.py).
set -u
OUT=${1:?output directory}
PART=${2:?part: 1, 2, 3, 4, 5 or 6}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
  python -c "import deepspeed; print('deepspeed', deepspeed.__version__)"
  python -c "import diffusers, torch_geometric; print('diffusers', diffusers.__version__, 'torch_geometric', torch_geometric.__version__)"
  nproc
} > "$OUT/system-$PART.txt" 2>&1
run() {
  name=$1; n=$2; script=$3; shift 3
  if [ -n "${ONLY:-}" ]; then case " $ONLY " in *" $name "*) MATCHED="$MATCHED $name" ;; *) return 0 ;; esac; fi
  name=$name${SUFFIX:-}
  devices=0; [ "$n" = 2 ] && devices=0,1
  prof=(); stacks=${KERNEL_PROFILE_STACKS:-}
  if [ "${PROFILE:-0}" = 1 ]; then prof=(--kernel-profile "$OUT/$name"); stacks=1; fi
  CUDA_VISIBLE_DEVICES=$devices KERNEL_PROFILE_STACKS=$stacks torchrun --standalone --nproc-per-node "$n" "presets/workloads/$script" \
    --steps "${STEPS:-8}" --json-out "$OUT/$name.json" "$@" ${prof[@]+"${prof[@]}"} > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep -o '"median_step_s": [0-9.]*' "$OUT/$name.json" 2>/dev/null)"
}
rows() {
  # name                                  gpus script           options
  if [ "$PART" = 1 ]; then
  run dp2-z2-llama3.2-1b-s2048-mb2            2 deepspeed_gpt.py --model llama3.2-1b --zero 2 --micro-batch 2
  run dp2-z1-llama3.2-1b-s2048-mb2            2 deepspeed_gpt.py --model llama3.2-1b --zero 1 --micro-batch 2
  run dp2-z3-llama3.2-1b-s2048-mb2            2 deepspeed_gpt.py --model llama3.2-1b --zero 3 --micro-batch 2
  run dp2-z2-llama3.2-3b-s4096-mb1-ac         2 deepspeed_gpt.py --model llama3.2-3b --zero 2 --seq 4096 --ac full
  run dp2-z3-llama3.2-3b-s2048-mb2-ac         2 deepspeed_gpt.py --model llama3.2-3b --zero 3 --micro-batch 2 --ac full
  run dp2-z3-llama3-8b-l8-s4096-mb1-ac        2 deepspeed_gpt.py --model llama3-8b --layers 8 --zero 3 --seq 4096 --ac full
  elif [ "$PART" = 3 ]; then
  run pp2-z1-llama3.2-3b-s2048-mb1-ga8        2 deepspeed_gpt.py --model llama3.2-3b --pp 2 --zero 1 --grad-accum 8
  run pp2-z1-llama3.2-1b-s2048-mb2-ga8-ac     2 deepspeed_gpt.py --model llama3.2-1b --pp 2 --zero 1 --micro-batch 2 --grad-accum 8 --ac full
  elif [ "$PART" = 4 ]; then
  run dp2-z1-unet-sd15-b8                     2 deepspeed_unet.py --batch 8 --zero 1
  run g1-z1-unet-sd15-b8                      1 deepspeed_unet.py --batch 8 --zero 1
  run dp2-z1-gat-arxiv                        2 deepspeed_gat.py --zero 1
  run g1-z1-gat-arxiv                         1 deepspeed_gat.py --zero 1
  elif [ "$PART" = 5 ]; then
  # ZeRO-Infinity: optimizer state (and parameters) swapped to the folder $NVME (default /tmp/nvme-swap) through
  # DeepSpeed's async I/O extension (libaio must be installed), CPU Adam on the host
  nvme=${NVME:-/tmp/nvme-swap}; mkdir -p "$nvme"
  run g1-z3-llama-tiny-s2048-mb2-nvme         1 deepspeed_gpt.py --model llama-tiny --zero 3 --micro-batch 2 --offload-optimizer nvme --offload-param nvme --nvme-path "$nvme"
  run g1-z3-llama3.2-1b-l2-s2048-mb2-nvme     1 deepspeed_gpt.py --model llama3.2-1b --layers 2 --zero 3 --micro-batch 2 --offload-optimizer nvme --offload-param cpu --nvme-path "$nvme"
  elif [ "$PART" = 6 ]; then
  # ZeRO++ on one host of 2 GPUs: qwZ (ZeRO-3's weight all-gathers in int8) and qgZ (its gradient reduction as 4-bit
  # all-to-alls), DeepSpeed's quantizer extension JIT-compiled on the host; then the plain ZeRO-3 rows of PART 1 again
  # on the same host (suffix -base), so each ZeRO++ row has its own baseline
  run dp2-z3-llama3.2-3b-s2048-mb2-ac-qwz-qgz 2 deepspeed_gpt.py --model llama3.2-3b --zero 3 --micro-batch 2 --ac full --quantized-weights --quantized-gradients
  run dp2-z3-llama3-8b-l8-s4096-mb1-ac-qwz-qgz 2 deepspeed_gpt.py --model llama3-8b --layers 8 --zero 3 --seq 4096 --ac full --quantized-weights --quantized-gradients
  run dp2-z3-llama3.2-3b-s2048-mb2-ac-base    2 deepspeed_gpt.py --model llama3.2-3b --zero 3 --micro-batch 2 --ac full
  run dp2-z3-llama3-8b-l8-s4096-mb1-ac-base   2 deepspeed_gpt.py --model llama3-8b --layers 8 --zero 3 --seq 4096 --ac full
  run dp2-z3-llama3.2-3b-s2048-mb2-ac-qwz     2 deepspeed_gpt.py --model llama3.2-3b --zero 3 --micro-batch 2 --ac full --quantized-weights
  run dp2-z3-llama3.2-1b-s2048-mb2-qwz-qgz    2 deepspeed_gpt.py --model llama3.2-1b --zero 3 --micro-batch 2 --quantized-weights --quantized-gradients
  run dp2-z3-llama3.2-1b-s2048-mb2-base       2 deepspeed_gpt.py --model llama3.2-1b --zero 3 --micro-batch 2
  else
  run dp2-z1-resnet50-b128                    2 deepspeed_resnet.py --batch 128 --zero 1
  run dp2-z2-llama3.2-1b-s2048-mb1-ga4-fp16   2 deepspeed_gpt.py --model llama3.2-1b --zero 2 --grad-accum 4 --precision fp16
  run g1-z2-llama3.2-1b-s2048-mb2             1 deepspeed_gpt.py --model llama3.2-1b --zero 2 --micro-batch 2
  run g1-z3-llama3.2-1b-s2048-mb2-ac          1 deepspeed_gpt.py --model llama3.2-1b --zero 3 --micro-batch 2 --ac full
  run g1-z1-resnet50-b128                     1 deepspeed_resnet.py --batch 128 --zero 1
  run dp2-z2-llama3.2-1b-s2048-mb2-offload    2 deepspeed_gpt.py --model llama3.2-1b --zero 2 --micro-batch 2 --offload-optimizer cpu
  run g1-z2-llama3.2-1b-s2048-mb2-offload     1 deepspeed_gpt.py --model llama3.2-1b --zero 2 --micro-batch 2 --offload-optimizer cpu
  fi
}
MATCHED=""
rows
for want in ${ONLY:-}; do
  case " ${MATCHED:-} " in *" $want "*) ;; *) echo "ONLY: no row '$want' in PART $PART" >&2; exit 2 ;; esac
done
