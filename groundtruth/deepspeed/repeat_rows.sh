#!/usr/bin/env bash
# Rows of the `deepspeed` suite measured again, several rounds in turn on one host, with more steps than the records'
# eight (groundtruth/deepspeed/README.md, "Rows measured again").
# Run from the repository root on a host with the GPUs, DeepSpeed installed:
#   ROUNDS=2 STEPS=20 bash groundtruth/deepspeed/repeat_rows.sh OUT_DIR PART NAME...
# NAME: rows of measure.sh's PART; round R of row NAME writes OUT_DIR/NAME-rR.json and .log.
set -u
OUT=${1:?output directory}
PART=${2:?part of measure.sh}
shift 2
[ $# -gt 0 ] || { echo "give the rows' names (measure.sh)" >&2; exit 2; }
for r in $(seq 1 "${ROUNDS:-2}"); do
  for name in "$@"; do
    ONLY=$name SUFFIX=-r$r bash groundtruth/deepspeed/measure.sh "$OUT" "$PART"
  done
done
