"""What TE's modules share: the base module, parameter creation and initialisation, and the tensor-parallel
collectives of sequence-first activations ([s, b, ...], gathered and scattered along the sequence)."""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
import torch.distributed as dist


class NotModelled(NotImplementedError):
    """A Transformer Engine feature the stand-in does not model."""


_UNSUPPORTED_FLAGS = ("ub_overlap_ag", "ub_overlap_rs", "ub_overlap_rs_dgrad", "ub_bulk_wgrad", "ub_bulk_dgrad",
                      "ub_split_ag", "ub_split_rs", "ub_atomic_gemm_ag", "ub_atomic_gemm_rs", "delay_wgrad_compute")


def refuse_unmodelled(module: str, kwargs: dict) -> None:
    """Raise for a constructor flag whose behaviour the stand-in does not model."""
    for key in _UNSUPPORTED_FLAGS:
        if kwargs.get(key):
            raise NotModelled(f"transformer_engine.pytorch.{module}({key}=True): TE's communication-overlap user "
                              f"buffers and delayed wgrad are not modelled; turn the option off "
                              f"(Megatron-core: tp_comm_overlap / delay_wgrad_compute)")
    if kwargs.get("symmetric_ar_type"):
        raise NotModelled(f"transformer_engine.pytorch.{module}(symmetric_ar_type=...): symmetric-memory "
                          f"all-reduce is not modelled")


class TransformerEngineBaseModule(torch.nn.Module):
    """Base of the stand-in modules: TE's bookkeeping attributes, no FP8 state."""

    def __init__(self) -> None:
        super().__init__()
        self.fp8 = False
        self.fp8_calibration = False
        self.fp8_meta: dict[str, Any] = {"fp8_checkpoint": False, "recipe": None}
        self.tp_group: Any = None
        self.tp_size = 1
        self.sequence_parallel = False
        self.save_original_input = False

    def set_tensor_parallel_group(self, tp_group: Any) -> None:
        self.tp_group = tp_group

    def get_extra_state(self) -> torch.Tensor:
        return torch.empty(0)

    def set_extra_state(self, state: Any) -> None:
        return None

    def reset_fp8_meta_tensors(self) -> None:
        return None

    def backward_dw(self) -> None:
        return None


def device_of(device: Any) -> torch.device:
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    if isinstance(device, int):
        return torch.device("cuda", device)
    return torch.device(device)


def new_parameter(shape: tuple[int, ...], dtype: Any, device: Any) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.empty(shape, dtype=dtype or torch.float32, device=device_of(device)))


def initialize(param: torch.nn.Parameter, init_method: Callable | None, tracker: Callable | None,
               tracker_name: str | None) -> None:
    """TE's initialisation: `init_method(param)` on the tracker's forked RNG state (the model-parallel state by
    default), or a normal(0, 0.023) fill without one."""
    if param.device.type == "meta":
        return
    fork = contextlib.nullcontext()
    if tracker is not None:
        fork = tracker().fork(tracker_name) if tracker_name else tracker().fork()
    with fork, torch.no_grad():
        if init_method is None:
            param.normal_(0.0, 0.023)
        else:
            init_method(param)


def set_tp_attributes(param: torch.nn.Parameter, dim: int) -> None:
    """What TE (and Megatron) read of a tensor-parallel parameter."""
    param.tensor_model_parallel = True
    param.partition_dim = dim
    param.partition_stride = 1


def group_size(group: Any, tp_size: int | None) -> int:
    if group is None or not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def gather_sequence(x: torch.Tensor, group: Any, async_op: bool = False):
    """All-gather along dim 0 (sequence-first); (output, work handle or None)."""
    n = dist.get_world_size(group)
    x = x.contiguous()
    out = torch.empty((x.shape[0] * n, *x.shape[1:]), dtype=x.dtype, device=x.device)
    work = dist.all_gather_into_tensor(out, x, group=group, async_op=async_op)
    return out, work


def reduce_scatter_sequence(x: torch.Tensor, group: Any, async_op: bool = False):
    """Reduce-scatter along dim 0 (sequence-first); (output, work handle or None)."""
    n = dist.get_world_size(group)
    x = x.contiguous()
    if x.shape[0] % n:
        raise ValueError(f"sequence parallelism: the sequence dimension ({x.shape[0]}) is not divisible by the "
                         f"tensor-parallel size ({n})")
    out = torch.empty((x.shape[0] // n, *x.shape[1:]), dtype=x.dtype, device=x.device)
    work = dist.reduce_scatter_tensor(out, x, group=group, async_op=async_op)
    return out, work


def all_reduce(x: torch.Tensor, group: Any, async_op: bool = False):
    x = x.contiguous()
    work = dist.all_reduce(x, group=group, async_op=async_op)
    return x, work


def wait(work: Any) -> None:
    if work is not None:
        work.wait()
