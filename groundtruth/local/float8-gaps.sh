#!/usr/bin/env bash
# Where the GPU of a compiled Float8 FSDP2 step waits: the `local` suite's two compiled Float8 tensorwise rows on
# 2 x H200 (simulated 8-9% fast while their kernels match in situ) beside their compiled bf16 twins (within 5%),
# each with torch.profiler on steps 3-4 (rank 0's timeline of every GPU activity: timeline.json, launchers.json)
# and steps 5-8 unprofiled. Needs torchao (`pip install torchao` with torch pinned). From the repository root:
#   bash groundtruth/local/float8-gaps.sh OUT_DIR
# Everything is appended to OUT_DIR/float8-gaps.tar as each run finishes.
set -u
OUT=${1:?output directory}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv
  python -c "import torch, triton, torchao; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'torchao', torchao.__version__)"
  nproc
} > "$OUT/system.txt" 2>&1
tar -cf "$OUT/float8-gaps.tar" -C "$OUT" system.txt
run() {
  name=$1; shift
  torchrun --standalone --nproc-per-node 2 presets/workloads/llama.py --steps 8 --json-out "$OUT/$name.json" \
    --kernel-profile "$OUT/kp-$name" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep -o '"median_step_s": [0-9.]*' "$OUT/$name.json" 2>/dev/null)"
  (cd "$OUT" && tar -rf float8-gaps.tar "$name".* "kp-$name")
}
run llama3.2-3b-fsdp2-s4096-b2-ac-sel-compile-f8t --model llama3.2-3b --dp-mode fsdp --seq 4096 --batch 2 --ac selective \
    --compile --float8 tensorwise
run llama3.2-3b-fsdp2-s4096-b2-ac-sel-compile     --model llama3.2-3b --dp-mode fsdp --seq 4096 --batch 2 --ac selective \
    --compile
run llama3-8b-fsdp2-s4096-b1-ac-none-compile-f8t  --model llama3-8b --dp-mode fsdp --seq 4096 --batch 1 --ac none \
    --compile --float8 tensorwise
run llama3-8b-fsdp2-s4096-b1-ac-none-compile      --model llama3-8b --dp-mode fsdp --seq 4096 --batch 1 --ac none \
    --compile
