"""Throughput figures shared by live-run summaries and replays."""

from __future__ import annotations


def tokens_per_s_per_gpu(tokens_per_iteration: float | None, iteration_s: float | None,
                         world_size: int) -> float | None:
    """Global tokens per iteration over the iteration time, per GPU (None when either is unknown)."""
    if not tokens_per_iteration or not iteration_s or world_size <= 0:
        return None
    return tokens_per_iteration / iteration_s / world_size


def mfu(tokens_per_s_per_gpu: float | None, flops_per_token: float | None, peak_flops: float) -> float | None:
    """Model FLOPs utilisation: model FLOPs per second per GPU over the GPU's dense peak (TorchTitan's MFU)."""
    if tokens_per_s_per_gpu is None or not flops_per_token or not peak_flops:
        return None
    return tokens_per_s_per_gpu * flops_per_token / peak_flops


def iteration_times(marks_by_rank: dict[int, list[float]]) -> list[float]:
    """Iteration times from per-rank ITER_MARK times: iteration k ends when the slowest rank marks it."""
    lists = [m for m in marks_by_rank.values() if len(m)]
    if not lists:
        return []
    n = min(len(m) for m in lists)
    ends = [max(m[i] for m in lists) for i in range(n)]
    return [b - a for a, b in zip(ends, ends[1:])]
