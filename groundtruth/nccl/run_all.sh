#!/usr/bin/env bash
# The measurement run behind groundtruth/nccl/h200x2/: every GPU of the host, eager and CUDA-graph timings, each
# protocol forced for the ring collectives, and one probe pass with NCCL's INFO log (its algorithm/protocol choices).
# Usage: bash groundtruth/nccl/run_all.sh OUTDIR   (writes OUTDIR/nccl.tgz and OUTDIR/eager.log)
set -o pipefail
OUTDIR=${1:?usage: run_all.sh OUTDIR}
export PYTHONUNBUFFERED=1
N=$(nvidia-smi -L | wc -l)
R=$(mktemp -d)
S=groundtruth/nccl/measure_collectives.py
T="timeout 170 python3 -m torch.distributed.run --nproc-per-node $N"
{ nvidia-smi; nvidia-smi topo -m; nvidia-smi nvlink -s; env | grep -E '^(NCCL|TORCH_NCCL|TORCH_SYMM|NVSHMEM)' ; } > $R/system.txt 2>&1
$T $S --out $R/eager --target-ms 100 2>&1 | tee $R/eager.log
$T $S --out $R/graph --graph --target-ms 60 2>&1 | tee $R/graph.log
for p in LL LL128 Simple; do
  NCCL_PROTO=$p $T $S --out $R/proto_$p --ops all_reduce,all_gather,reduce_scatter --target-ms 30 -f 4 2>&1 | tee $R/proto_$p.log
done
mkdir -p $R/probe
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,TUNING,ENV NCCL_DEBUG_FILE=$R/probe/nccl.%h.%p.log \
  $T $S --out $R/probe --probe -f 4 > $R/probe.log 2>&1
tar -czf $OUTDIR/nccl.tgz -C $R .
cp $R/eager.log $OUTDIR/
