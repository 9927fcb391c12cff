#!/usr/bin/env bash
# Host memory traffic of ZeRO-Offload's host work by thread count and by processes running at once, on one GPU host
# (the `[host]` rate tables of the cluster presets, and how far processes sharing a host slow each other;
# docs/host-cpu.md, "Host compute"; groundtruth/deepspeed/README.md, "Host compute by threads and processes").
# Run from the repository root on the host, DeepSpeed installed:  bash groundtruth/deepspeed/host_scaling.sh OUT_DIR
# ELEMENTS, THREADS, TOGETHER and DELAY (seconds for processes started together to set up) choose the sizes and
# runs (defaults below).
# Writes OUT_DIR/system.txt (CPU, cores, NUMA), threads.jsonl (one process at 1-32 threads and with OMP_NUM_THREADS
# unset: all cores) and processes.jsonl (P processes started together, each at T threads, P x T up to the cores;
# each line tagged "P=..,T=..,i=..").
set -u
OUT=${1:?output directory}
mkdir -p "$OUT"
for f in threads.jsonl processes.jsonl; do   # results are appended: a second run would mix into the first's
  [ -e "$OUT/$f" ] && { echo "$OUT/$f exists: give an empty OUT_DIR" >&2; exit 2; }
done
D=groundtruth/deepspeed
N=${ELEMENTS:-100000000}   # elements per tensor (the earlier tables: 100,000,000)
THREADS=${THREADS-1 2 4 8 16 24 32 unset}        # one process at each thread count, in this order ("": none)
TOGETHER=${TOGETHER-2:1 4:1 8:1 2:8 2:16 4:8}   # P:T, P processes at T threads started together ("": none)
{ nproc; lscpu; numactl --hardware 2>/dev/null; free -g
  python -c "import torch, deepspeed; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__)"
} > "$OUT/system.txt" 2>&1
# build DeepSpeed's CPU Adam once, before processes start together
OMP_NUM_THREADS=1 python $D/cpu_adam_bench.py --elements 1000000 --tag build > "$OUT/build.log" 2>&1
echo "build rc=$?"
for T in $THREADS; do
  if [ "$T" = unset ]; then
    env -u OMP_NUM_THREADS python $D/host_ops_bench.py --elements $N --tag "T=unset" >> "$OUT/threads.jsonl"
    env -u OMP_NUM_THREADS python $D/cpu_adam_bench.py --elements $N --tag "T=unset" >> "$OUT/threads.jsonl"
  else OMP_NUM_THREADS=$T python $D/host_ops_bench.py --elements $N --tag "T=$T" >> "$OUT/threads.jsonl"
    OMP_NUM_THREADS=$T python $D/cpu_adam_bench.py --elements $N --tag "T=$T" >> "$OUT/threads.jsonl"
  fi
  echo "threads $T done"
done
together() {   # P processes at T threads each, timing from one moment after their set-up
  P=$1; T=$2; script=$3
  start=$(python -c "import time; print(time.time() + ${DELAY:-15})")
  for i in $(seq 1 "$P"); do
    OMP_NUM_THREADS=$T python $D/$script --elements $N --start-at "$start" --tag "P=$P,T=$T,i=$i" \
      >> "$OUT/processes-$P-$T-$i.part" &
  done
  wait
  cat "$OUT"/processes-"$P"-"$T"-*.part >> "$OUT/processes.jsonl"; rm -f "$OUT"/processes-"$P"-"$T"-*.part
}
for PT in $TOGETHER; do
  P=${PT%:*}; T=${PT#*:}
  together "$P" "$T" host_ops_bench.py
  together "$P" "$T" cpu_adam_bench.py
  echo "processes $P x threads $T done"
done
