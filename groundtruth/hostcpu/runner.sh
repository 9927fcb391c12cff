# Sourced by measure.sh and measure-compile.sh: the measuring host's description (OUT/system.txt) and `run NAME
# GPUS ARGS...`, which runs the reference workload with the tiny model for 12 steps under torchrun and writes
# OUT/NAME.json (the workload's SUMMARY) and OUT/NAME.log. Needs OUT set.
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  lscpu | grep -E "Model name|^CPU\(s\)|Thread|MHz"
  python -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
} > "$OUT/system.txt" 2>&1
NG=$(nvidia-smi -L | wc -l)
run() {
  name=$1; n=$2; shift 2
  if [ "$n" -gt "$NG" ]; then echo "$name skipped (needs $n GPUs)"; return; fi
  torchrun --standalone --nproc-per-node "$n" presets/workloads/llama.py --model llama-tiny --steps 12 \
    --json-out "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep -o '"median_step_s": [0-9.]*' "$OUT/$name.json" 2>/dev/null)"
}
