#!/usr/bin/env bash
# torchrun --no-python entry point: runs `python "$@"` pinned to the CPUs that PIN_RANK<LOCAL_RANK> lists
# (taskset's list syntax, e.g. PIN_RANK0=4,5); unpinned where that variable is unset.
var="PIN_RANK${LOCAL_RANK:-0}"
if [ -n "${!var:-}" ]; then exec taskset -c "${!var}" python "$@"; fi
exec python "$@"
