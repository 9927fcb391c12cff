#!/usr/bin/env bash
# Compiled rows of the `local` suite: the reference workload (presets/workloads/llama.py) with `--compile` (each
# block compiled with torch.compile(fullgraph=True), as TorchTitan does), and an eager run of the same shape as a
# baseline of the same host. One configuration also records its kernels in situ (--kernel-profile: the generated
# Triton kernels' own GPU times).
# Run from the repository root on a host with the GPUs:  bash groundtruth/local/measure-compile.sh OUT_DIR NGPUS
# Each configuration writes OUT_DIR/<name>.json (the workload's SUMMARY) and OUT_DIR/<name>.log; everything is also
# appended to OUT_DIR/compile-runs.tar as it finishes.
set -u
OUT=${1:?output directory}
N=${2:?number of GPUs: 1 or 2}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv
  python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  nproc
} > "$OUT/system.txt" 2>&1
tar -cf "$OUT/compile-runs.tar" -C "$OUT" system.txt
run() {
  name=$1; shift
  torchrun --standalone --nproc-per-node "$N" presets/workloads/llama.py --steps 8 --json-out "$OUT/$name.json" "$@" \
    > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep -o '"median_step_s": [0-9.]*' "$OUT/$name.json" 2>/dev/null) $(grep -o '"peak_mem_gib": [0-9.]*' "$OUT/$name.json" 2>/dev/null)"
  (cd "$OUT" && tar -rf compile-runs.tar "$name".* $(ls -d "kp-$name" 2>/dev/null))
}
if [ "$N" = 1 ]; then
  run llama3.2-1b-g1-s2048-b4-ac-none-compile  --model llama3.2-1b --seq 2048 --batch 4 --ac none --compile
  run llama3.2-1b-g1-s2048-b4-ac-none          --model llama3.2-1b --seq 2048 --batch 4 --ac none
  run llama3-8b-l8-g1-s4096-b2-ac-none-compile --model llama3-8b --layers 8 --seq 4096 --batch 2 --ac none --compile \
      --kernel-profile "$OUT/kp-llama3-8b-l8-g1-s4096-b2-ac-none-compile"
  run llama3.2-3b-g1-s4096-b2-ac-full-compile  --model llama3.2-3b --seq 4096 --batch 2 --ac full --compile
  run llama3.2-3b-g1-s8192-b1-ac-sel-compile   --model llama3.2-3b --seq 8192 --batch 1 --ac selective --compile
else
  run llama3.2-1b-fsdp2-s2048-b8-ac-none-compile --model llama3.2-1b --dp-mode fsdp --seq 2048 --batch 8 --ac none --compile
  run llama3.2-3b-fsdp2-s4096-b2-ac-sel-compile  --model llama3.2-3b --dp-mode fsdp --seq 4096 --batch 2 --ac selective --compile
  run llama3-8b-fsdp2-s4096-b1-ac-none-compile   --model llama3-8b --dp-mode fsdp --seq 4096 --batch 1 --ac none --compile
  run llama3.2-1b-tp2-s4096-b2-ac-none-compile   --model llama3.2-1b --tp 2 --seq 4096 --batch 2 --ac none --compile
fi
