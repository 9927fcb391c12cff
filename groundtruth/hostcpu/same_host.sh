#!/usr/bin/env bash
# Host-bound rows measured together with the host-CPU calibration of the host they ran on: one 2-GPU host, one
# session. PART cal: each CPU's speed at a fixed piece of host work (host_speed.py), then measure.sh's thirteen tiny
# steps (OUT/cal), from which `python -m phantora.probes.hostcpu OUT/cal` fits this host's prices. PART rows: the
# `local` suite's three eager TP 2 rows (as repeat_tp.sh runs them) and the `deepspeed` suite's three host-bound
# ZeRO-3 rows (as groundtruth/deepspeed/measure.sh runs them; DeepSpeed 0.19.8, FusedAdam built on first use),
# then g1-fsdp-none and g2-tp2-none of the calibration again and a second speed scan: did the host move meanwhile?
# A row whose JSON exists is not run again, so a part cut short can be run again.
# Run from the repository root on a 2-GPU host:  bash groundtruth/hostcpu/same_host.sh OUT_DIR cal|rows
set -u
OUT=${1:?output directory}
PART=${2:?part: cal or rows}
mkdir -p "$OUT/cal" "$OUT/rows"
scan() { [ -f "$OUT/speed-$1.json" ] || python groundtruth/hostcpu/host_speed.py --rounds 1 --out "$OUT/speed-$1.json" \
  > /dev/null 2>&1; }
if [ "$PART" = cal ]; then
  scan before
  # measure.sh with its rows skipped where done: runner.sh's run() is replaced by one that checks first
  OUT="$OUT/cal"
  . "$(dirname "$0")/runner.sh"
  eval "orig_$(declare -f run)"
  run() { [ -f "$OUT/$1.json" ] && { echo "$1 done"; return; }; orig_run "$@"; }
  . <(sed -n '/^T=/,$p' "$(dirname "$0")/measure.sh")
  exit 0
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
  python -c "import deepspeed; print('deepspeed', deepspeed.__version__)"
  lscpu | grep -E "Model name|^CPU\(s\)|Hypervisor"
} > "$OUT/rows/system.txt" 2>&1
row() {
  name=$1; n=$2; script=$3; shift 3
  [ -f "$OUT/rows/$name.json" ] && { echo "$name done"; return; }
  devices=0; [ "$n" = 2 ] && devices=0,1
  CUDA_VISIBLE_DEVICES=$devices torchrun --standalone --nproc-per-node "$n" "presets/workloads/$script" --steps 8 \
    --json-out "$OUT/rows/$name.json" "$@" > "$OUT/rows/$name.log" 2>&1
  echo "$name rc=$? $(grep -o '"median_step_s": [0-9.]*' "$OUT/rows/$name.json" 2>/dev/null)"
}
row llama3.2-1b-tp2-s4096-b2-ac-none  2 llama.py --model llama3.2-1b --tp 2 --seq 4096 --batch 2 --ac none
row llama3.2-3b-tp2-s8192-b1-ac-full  2 llama.py --model llama3.2-3b --tp 2 --seq 8192 --batch 1 --ac full
row llama3-8b-tp2-s4096-b1-ac-none    2 llama.py --model llama3-8b --tp 2 --seq 4096 --batch 1 --ac none
export TORCH_CUDA_ARCH_LIST=9.0
row dp2-z3-llama3.2-1b-s2048-mb2      2 deepspeed_gpt.py --model llama3.2-1b --zero 3 --micro-batch 2
row g1-z3-llama3.2-1b-s2048-mb2-ac    1 deepspeed_gpt.py --model llama3.2-1b --zero 3 --micro-batch 2 --ac full
row dp2-z3-llama3.2-3b-s2048-mb2-ac   2 deepspeed_gpt.py --model llama3.2-3b --zero 3 --micro-batch 2 --ac full
T="--model llama-tiny --steps 12 --seq 256 --batch 1 --ac none"
row again-g1-fsdp-none                1 llama.py $T --dp-mode fsdp
row again-g2-tp2-none                 2 llama.py $T --tp 2
scan after
