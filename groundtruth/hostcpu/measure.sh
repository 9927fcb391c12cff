#!/usr/bin/env bash
# Host-CPU ground truth: the reference workload (presets/workloads/llama.py) with a tiny model, so small that every
# GPU kernel finishes before the host has issued the next: the step time is the host's time to issue the step.
# Run from the repository root on a GPU host:  bash groundtruth/hostcpu/measure.sh OUT_DIR
# Each configuration writes OUT_DIR/<name>.json (the workload's SUMMARY) and OUT_DIR/<name>.log.
set -u
OUT=${1:?output directory}
. "$(dirname "$0")/runner.sh"
T="--seq 256 --batch 1"
run g1-fsdp-none     1 --dp-mode fsdp $T --ac none
run g1-fsdp-full     1 --dp-mode fsdp $T --ac full
run g1-fsdp-sel      1 --dp-mode fsdp $T --ac selective
run g1-ddp-none      1 --dp-mode ddp  $T --ac none
run g1-fsdp-none-l8  1 --dp-mode fsdp $T --ac none --layers 8
run g1-ddp-none-l8   1 --dp-mode ddp  $T --ac none --layers 8
run g2-fsdp-none     2 --dp-mode fsdp $T --ac none
run g2-fsdp-full     2 --dp-mode fsdp $T --ac full
run g2-ddp-none      2 --dp-mode ddp  $T --ac none
run g2-tp2-none      2 --tp 2 $T --ac none
run g2-tp2-full      2 --tp 2 $T --ac full
run g2-tp2-none-l8   2 --tp 2 $T --ac none --layers 8
run g2-pp2-none      2 --pp 2 --microbatches 4 --seq 256 --batch 4 --ac none
