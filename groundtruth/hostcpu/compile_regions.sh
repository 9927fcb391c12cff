#!/usr/bin/env bash
# Host time of FSDP2's parts and of the compiled blocks' calls in compiled (and Float8) two-GPU FSDP steps:
# groundtruth/hostcpu/fsdp_regions.py around the reference workload, on a 2-GPU host, without a profiler. The same
# commands under `phantora run --cluster h200-2gpu-nvlink --gpus-per-node 2 --no-trace -- python ...` give the
# simulated side. Needs torchao for the Float8 rows. From the repository root:
#   bash groundtruth/hostcpu/compile_regions.sh OUT_DIR
# Each configuration writes OUT_DIR/<name>.json (regions) and OUT_DIR/<name>.log; all go into OUT_DIR/regions.tar.
set -u
OUT=${1:?output directory}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv
  python -c "import torch, triton, torchao; print('torch', torch.__version__, 'triton', triton.__version__, 'torchao', torchao.__version__)"
  nproc; lscpu | grep -E 'Model name|MHz'
} > "$OUT/system.txt" 2>&1
tar -cf "$OUT/regions.tar" -C "$OUT" system.txt
run() {
  name=$1; shift
  torchrun --standalone --nproc-per-node 2 groundtruth/hostcpu/fsdp_regions.py --out "$OUT/$name.json" -- \
    presets/workloads/llama.py --dp-mode fsdp --steps 10 --compile "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep -E '^step 10 ' "$OUT/$name.log")"
  (cd "$OUT" && tar -rf regions.tar "$name".*)
}
run tiny-s256-b1-none-compile      --model llama-tiny --seq 256 --batch 1 --ac none
run tiny-s256-b1-none-compile-f8t  --model llama-tiny --seq 256 --batch 1 --ac none --float8 tensorwise
run 3b-s4096-b2-sel-compile-f8t    --model llama3.2-3b --seq 4096 --batch 2 --ac selective --float8 tensorwise
run 3b-s4096-b2-sel-compile        --model llama3.2-3b --seq 4096 --batch 2 --ac selective
run 8b-s4096-b1-none-compile-f8t   --model llama3-8b --seq 4096 --batch 1 --ac none --float8 tensorwise
