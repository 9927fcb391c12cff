"""The peak allocated memory of a run measured with one of the project's workloads, as a record carries it."""

from __future__ import annotations

ASSUMED = ("rank 0's torch.cuda.max_memory_allocated over the run (the workload's SUMMARY peak_mem_gib); the ranks "
           "of this configuration hold about the same")


def allocated_memory(peak_gib: float, pp: int) -> tuple[str, dict, dict]:
    """The notes' sentence on a run's peak allocated memory (the workload's `peak_mem_gib`, read on rank 0), the
    metric and its assumption. None with pipeline stages: rank 0 is the first stage, and a record's memory is the
    largest over its GPUs."""
    said = f"Peak memory (torch.cuda.max_memory_allocated) was {peak_gib:.2f} GiB"
    if pp > 1:
        return (f"{said}; it is not recorded as a metric: only rank 0 (the first pipeline stage) was read, and a "
                f"record's memory is the largest over its GPUs.", {}, {})
    return (f"{said}; it is recorded as metrics.memory_allocated_gib.",
            {"memory_allocated_gib": round(peak_gib, 3)}, {"metrics.memory_allocated_gib": ASSUMED})
