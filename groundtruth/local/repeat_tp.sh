#!/usr/bin/env bash
# The `local` suite's three eager TP 2 rows (host-bound: their GPUs idle half the step) run again, three times each,
# exactly as measure.sh / measure2.sh ran them (torchrun, 8 steps, unpinned), with each CPU's speed at a fixed piece
# of host work scanned before, between and after (groundtruth/hostcpu/host_speed.py): how far one configuration's
# step moves between runs on one host, against the records.
# Run from the repository root on a 2-GPU host:  bash groundtruth/local/repeat_tp.sh OUT_DIR [RUNS, default 3]
set -u
OUT=${1:?output directory}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
  lscpu | grep -E "Model name|^CPU\(s\)|Hypervisor"
} > "$OUT/system.txt" 2>&1
scan() { python groundtruth/hostcpu/host_speed.py --rounds 1 --out "$OUT/speed-$1.json" > /dev/null 2>&1; }
run() {
  name=$1; shift
  torchrun --standalone --nproc-per-node 2 presets/workloads/llama.py --steps 8 --json-out "$OUT/$name.json" "$@" \
    > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep -o '"median_step_s": [0-9.]*' "$OUT/$name.json" 2>/dev/null)"
}
RUNS=${2:-3}
scan 0
for i in $(seq "$RUNS"); do
  run llama3.2-1b-tp2-s4096-b2-ac-none-r$i --model llama3.2-1b --tp 2 --seq 4096 --batch 2 --ac none
  run llama3.2-3b-tp2-s8192-b1-ac-full-r$i --model llama3.2-3b --tp 2 --seq 8192 --batch 1 --ac full
  run llama3-8b-tp2-s4096-b1-ac-none-r$i   --model llama3-8b --tp 2 --seq 4096 --batch 1 --ac none
  scan $i
done
