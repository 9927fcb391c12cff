"""The GEMM libraries' workspaces that PyTorch takes from its caching allocator.

PyTorch gives cuBLAS (and cuBLASLt) a workspace allocated through its caching allocator the first time a GEMM runs
on a (cuBLAS handle, stream) pair, and keeps it for the life of the process: it counts in
`torch.cuda.memory_allocated()`. Handles are per thread, and the autograd engine runs a CUDA device's backward ops
on a thread of its own, so a training step holds one workspace for its forward's stream and one for its backward's.
Measured on an H200 with torch 2.11 (groundtruth/insitu/blas_workspace.py, `h200-scratch/blas_workspace.txt`):

- the first GEMM of any kind on a (thread, stream): 32 MiB (cuBLAS's workspace on sm90; `CUBLAS_WORKSPACE_CONFIG`
  sets it: the sum of its `:SIZE_KiB:COUNT` pairs);
- the first GEMM with a bias epilogue there (addmm, `F.linear` with a bias; also FP8's `_scaled_mm`): 1 MiB more
  (cuBLASLt's, `CUBLASLT_WORKSPACE_SIZE` in KiB);
- the first GEMM of a backward: both again, on the autograd engine's thread; one on another side stream or in
  another thread: again.

Before sm90, torch's default `CUBLAS_WORKSPACE_CONFIG` is `:4096:2:16:8` (8.125 MiB; torch's source, not measured).
The interceptor calls `take` before each kernel; a new workspace is an allocation on the current stream that is
never freed (memtrack.keep).
"""

from __future__ import annotations

import os
import re
import threading

import torch

GEMMS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "_addmm_activation", "addmv", "mv", "_scaled_mm",
                   "_int_mm", "_scaled_grouped_mm", "_grouped_mm"})
LT_GEMMS = frozenset({"addmm", "_addmm_activation", "_scaled_mm", "_scaled_grouped_mm"})
KiB = 1024
_HOPPER_CONFIG = ":4096:8"            # 32 MiB, measured on an H200
_OLDER_CONFIG = ":4096:2:16:8"
_LT_KIB = 1024                         # measured on an H200


def cublas_bytes(sm: int, config: str | None = None) -> int:
    """cuBLAS's workspace for one (handle, stream): the sum of `CUBLAS_WORKSPACE_CONFIG`'s `:SIZE_KiB:COUNT` pairs
    (parts that are not such a pair are skipped, as torch skips them), or torch's default for the compute
    capability."""
    text = config if config is not None else os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if text is None:
        text = _HOPPER_CONFIG if sm >= 90 else _OLDER_CONFIG
    return sum(int(size) * int(count) for size, count in re.findall(r":([0-9]+):([0-9]+)", text)) * KiB


def cublaslt_bytes(setting: str | None = None) -> int:
    """cuBLASLt's workspace for one (handle, stream): `CUBLASLT_WORKSPACE_SIZE` in KiB, else 1 MiB."""
    text = setting if setting is not None else os.environ.get("CUBLASLT_WORKSPACE_SIZE", "")
    return int(text) * KiB if text.strip().isdigit() else _LT_KIB * KiB


class Workspaces:
    """Which (thread, device, stream) triples hold a cuBLAS / cuBLASLt workspace already."""

    def __init__(self, sm: int):
        self.sm = sm
        self._held: set[tuple] = set()

    def take(self, name: str, device: int, mem) -> None:
        """Before GEMM `name` runs on `device`'s current stream: allocate the workspaces its handle lacks there."""
        if name not in GEMMS:
            return
        thread = "autograd" if torch._C._current_graph_task_id() >= 0 else threading.get_ident()
        stream = mem.dev.stream(device)
        for library in ("cublas", "cublaslt") if name in LT_GEMMS else ("cublas",):
            key = (library, thread, device, stream)
            if key not in self._held:
                self._held.add(key)
                mem.keep(cublas_bytes(self.sm) if library == "cublas" else cublaslt_bytes(), device)
