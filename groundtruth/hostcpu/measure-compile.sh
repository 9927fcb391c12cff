#!/usr/bin/env bash
# Host-CPU ground truth of compiled steps: the reference workload (presets/workloads/llama.py) with the tiny model
# and `--compile` (each block torch.compile(fullgraph=True)), with and without torchao's Float8 (tensorwise), so
# small that the step time is the host's time to issue it: the compiled regions' calls, their generated kernels'
# launches and everything around them. Needs torchao for the Float8 rows.
# Run from the repository root on a GPU host:  bash groundtruth/hostcpu/measure-compile.sh OUT_DIR
# Each configuration writes OUT_DIR/<name>.json (the workload's SUMMARY) and OUT_DIR/<name>.log.
set -u
OUT=${1:?output directory}
. "$(dirname "$0")/runner.sh"
T="--seq 256 --batch 1 --ac none --compile"
run g1-fsdp-compile        1 --dp-mode fsdp $T
run g1-fsdp-compile-l8     1 --dp-mode fsdp $T --layers 8
run g2-fsdp-compile        2 --dp-mode fsdp $T
run g1-fsdp-compile-f8t    1 --dp-mode fsdp $T --float8 tensorwise
run g2-fsdp-compile-f8t    2 --dp-mode fsdp $T --float8 tensorwise
run g1-fsdp-eager          1 --dp-mode fsdp --seq 256 --batch 1 --ac none
