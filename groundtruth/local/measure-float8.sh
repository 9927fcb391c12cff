#!/usr/bin/env bash
# Float8 rows of the `local` suite: the reference workload (presets/workloads/llama.py) with `--float8 tensorwise` or
# `rowwise` (torchao's convert_to_float8_training on the blocks' linear layers), compiled and eager. One
# configuration also records its kernels in situ (--kernel-profile: the FP8 GEMMs' and scaling kernels' own times).
# Needs torchao (`pip install torchao` with torch pinned). Run from the repository root on a host with the GPUs:
#   bash groundtruth/local/measure-float8.sh OUT_DIR NGPUS
# Each configuration writes OUT_DIR/<name>.json (the workload's SUMMARY) and OUT_DIR/<name>.log; everything is also
# appended to OUT_DIR/float8-runs.tar as it finishes.
set -u
OUT=${1:?output directory}
N=${2:?number of GPUs: 1 or 2}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv
  python -c "import torch, triton, torchao; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'torchao', torchao.__version__)"
  nproc
} > "$OUT/system.txt" 2>&1
tar -cf "$OUT/float8-runs.tar" -C "$OUT" system.txt
run() {
  name=$1; shift
  torchrun --standalone --nproc-per-node "$N" presets/workloads/llama.py --steps 8 --json-out "$OUT/$name.json" "$@" \
    > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep -o '"median_step_s": [0-9.]*' "$OUT/$name.json" 2>/dev/null) $(grep -o '"peak_mem_gib": [0-9.]*' "$OUT/$name.json" 2>/dev/null)"
  (cd "$OUT" && tar -rf float8-runs.tar "$name".* $(ls -d "kp-$name" 2>/dev/null))
}
if [ "$N" = 1 ]; then
  run llama3.2-1b-g1-s2048-b4-ac-none-compile-f8t --model llama3.2-1b --seq 2048 --batch 4 --ac none --compile --float8 tensorwise
  run llama3.2-1b-g1-s2048-b4-ac-none-f8t         --model llama3.2-1b --seq 2048 --batch 4 --ac none --float8 tensorwise
  run llama3-8b-l8-g1-s4096-b2-ac-none-compile-f8t --model llama3-8b --layers 8 --seq 4096 --batch 2 --ac none --compile \
      --float8 tensorwise --kernel-profile "$OUT/kp-llama3-8b-l8-g1-s4096-b2-ac-none-compile-f8t"
  run llama3-8b-l8-g1-s4096-b2-ac-none-compile-f8r --model llama3-8b --layers 8 --seq 4096 --batch 2 --ac none --compile \
      --float8 rowwise
  run llama3.2-3b-g1-s4096-b2-ac-full-compile-f8t --model llama3.2-3b --seq 4096 --batch 2 --ac full --compile --float8 tensorwise
else
  run llama3.2-3b-fsdp2-s4096-b2-ac-sel-compile-f8t --model llama3.2-3b --dp-mode fsdp --seq 4096 --batch 2 --ac selective \
      --compile --float8 tensorwise
  run llama3-8b-fsdp2-s4096-b1-ac-none-compile-f8t  --model llama3-8b --dp-mode fsdp --seq 4096 --batch 1 --ac none \
      --compile --float8 tensorwise
  run llama3-8b-fsdp2-s4096-b1-ac-none-compile-f8r  --model llama3-8b --dp-mode fsdp --seq 4096 --batch 1 --ac none \
      --compile --float8 rowwise
  run llama3.2-1b-fsdp2-s2048-b8-ac-none-f8t        --model llama3.2-1b --dp-mode fsdp --seq 2048 --batch 8 --ac none \
      --float8 tensorwise
fi
