#!/usr/bin/env bash
# The `local` suite's eager TP 2 rows measured in situ on 2 x H200: each row's configuration with rank 0's kernels
# and ops recorded (--kernel-profile: steps 3-4), 10 steps; and the host-bound TP 2 configuration of
# groundtruth/hostcpu/measure.sh (llama-tiny, seq 256), which the host-CPU prices were fitted on, as this host's
# yardstick. Run from the repository root on a 2-GPU host:  bash groundtruth/insitu/tp_rows.sh OUT_DIR
set -u
OUT=${1:?output directory}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
  lscpu | grep -E "Model name|^CPU\(s\)"
} > "$OUT/system.txt" 2>&1
run() {
  name=$1; shift
  torchrun --standalone --nproc-per-node 2 presets/workloads/llama.py --json-out "$OUT/$name.json" "$@" \
    > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep -o '"median_step_s": [0-9.]*' "$OUT/$name.json" 2>/dev/null)"
}
run tiny-tp2-none --model llama-tiny --tp 2 --seq 256 --batch 1 --ac none --steps 12
run 1b-tp2-s4096-b2-none --model llama3.2-1b --tp 2 --seq 4096 --batch 2 --ac none --steps 10 --kernel-profile "$OUT/1b-tp2-s4096-b2-none"
run 3b-tp2-s8192-b1-full --model llama3.2-3b --tp 2 --seq 8192 --batch 1 --ac full --steps 10 --kernel-profile "$OUT/3b-tp2-s8192-b1-full"
run 8b-tp2-s4096-b1-none --model llama3-8b --tp 2 --seq 4096 --batch 1 --ac none --steps 10 --kernel-profile "$OUT/8b-tp2-s4096-b1-none"
run 1b-tp2-s4096-b2-none-noprof --model llama3.2-1b --tp 2 --seq 4096 --batch 2 --ac none --steps 10
