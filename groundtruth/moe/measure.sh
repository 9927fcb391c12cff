#!/usr/bin/env bash
# The measurement behind groundtruth/moe/<host>/: the small MoE trainer (presets/workloads/moe.py, 8 experts, top-2,
# dim 2048, expert FFN 2048, 4 layers, 16384 tokens per rank, bf16) on one GPU and with expert parallelism 2, the
# router forced to balance (as TorchTitan's _debug_force_load_balance) and to a Zipf skew of 1.2, then
# all_to_all_single with equal and uneven split sizes (groundtruth/nccl/measure_collectives.py, 1 MiB - 1 GiB).
# Usage, from the repository root on a host with 2 NVLinked GPUs: bash groundtruth/moe/measure.sh OUTDIR
set -o pipefail
OUT=${1:?usage: measure.sh OUTDIR}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
W=presets/workloads/moe.py
T="timeout 150 python3 -m torch.distributed.run --nproc-per-node 2"
{ nvidia-smi; nvidia-smi topo -m; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name())'; env | grep -E '^(NCCL|TORCH_NCCL)'; } > "$OUT/system.txt" 2>&1
timeout 150 python3 $W --ep 1 --route balanced --steps 12 --warmup 4 > "$OUT/moe-1gpu-balanced.log" 2>&1
$T $W --ep 2 --route balanced --steps 12 --warmup 4 > "$OUT/moe-ep2-balanced.log" 2>&1
$T $W --ep 2 --route zipf:1.2 --steps 12 --warmup 4 > "$OUT/moe-ep2-zipf1.2.log" 2>&1
R=$(mktemp -d)
$T groundtruth/nccl/measure_collectives.py --out "$R/a2a" --ops all_to_all,all_to_all_skew2,all_to_all_skew4,all_to_all_skew8 \
  -b 1M -e 1G -f 4 --target-ms 60 > "$R/a2a.log" 2>&1
cp "$R/a2a.log" "$R/a2a/"
tar -czf "$OUT/a2a.tgz" -C "$R" a2a
