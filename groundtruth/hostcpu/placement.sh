#!/usr/bin/env bash
# Does a host-bound step's time follow the CPU its process runs on? On one GPU host: each CPU's speed at a fixed
# piece of host work (host_speed.py, before and after), the one-GPU tiny step (g1-fsdp-none of measure.sh) three
# times unpinned and pinned to single CPUs (the fastest and slowest two of the scan, CPU 0 and the first CPU of the
# second half), and the two-GPU TP 2 and FSDP tiny steps unpinned and with each rank pinned to two fast CPUs.
# Run from the repository root on a 2-GPU host:  bash groundtruth/hostcpu/placement.sh OUT_DIR
set -u
OUT=${1:?output directory}
. "$(dirname "$0")/runner.sh"
{ lscpu; echo; nvidia-smi topo -m; echo; cat /sys/fs/cgroup/cpuset.cpus.effective 2>/dev/null
  echo "nproc $(nproc)"; grep -E "^cpu " /proc/stat; } > "$OUT/cpus.txt" 2>&1
python groundtruth/hostcpu/host_speed.py --rounds 3 --out "$OUT/speed-before.json" > "$OUT/speed-before.log" 2>&1
read -r FAST1 FAST2 FAST3 FAST4 SLOW1 SLOW2 <<< "$(python - "$OUT/speed-before.json" <<'PY'
import json, sys, statistics
rows = json.load(open(sys.argv[1]))["rows"]
by = {}
for r in rows:
    by.setdefault(r["cpu"], []).append(r["python_ns_per_call"])
order = sorted(by, key=lambda c: statistics.median(by[c]))
print(*order[:4], *order[-2:])
PY
)"
echo "fastest $FAST1 $FAST2 $FAST3 $FAST4, slowest $SLOW1 $SLOW2" | tee -a "$OUT/cpus.txt"
HALF=$(( $(nproc) / 2 ))
T="--seq 256 --batch 1 --ac none"
W="$(dirname "$0")/pinned.sh"
prun() {  # prun NAME GPUS ARGS...: run() through pinned.sh, so PIN_RANK<i> pins rank i
  name=$1; n=$2; shift 2
  torchrun --standalone --nproc-per-node "$n" --no-python bash "$W" presets/workloads/llama.py --model llama-tiny \
    --steps 12 --json-out "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep -o '"median_step_s": [0-9.]*' "$OUT/$name.json" 2>/dev/null)"
}
for i in 1 2 3; do run g1-fsdp-none-free$i 1 --dp-mode fsdp $T; done
for c in "$FAST1" "$FAST2" "$SLOW1" "$SLOW2" 0 "$HALF"; do
  PIN_RANK0=$c prun g1-fsdp-none-cpu$c 1 --dp-mode fsdp $T
done
for i in 1 2; do run g2-tp2-none-free$i 2 --tp 2 $T; done
for i in 1 2; do PIN_RANK0=$FAST1,$FAST2 PIN_RANK1=$FAST3,$FAST4 prun g2-tp2-none-fast$i 2 --tp 2 $T; done
run g2-fsdp-none-free1 2 --dp-mode fsdp $T
PIN_RANK0=$FAST1,$FAST2 PIN_RANK1=$FAST3,$FAST4 prun g2-fsdp-none-fast1 2 --dp-mode fsdp $T
python groundtruth/hostcpu/host_speed.py --rounds 3 --out "$OUT/speed-after.json" > "$OUT/speed-after.log" 2>&1
grep -E "^cpu " /proc/stat >> "$OUT/cpus.txt"
