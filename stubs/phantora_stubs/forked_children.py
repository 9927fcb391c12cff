"""What a forked child of a rank (a DataLoader worker) computes with the rank's tensors.

A rank's tensors are fake: a shape, a dtype, a device and, for small ones, a known value (values.py). A child forked
from the rank leaves the fake mode (fake.py) and makes real CPU tensors, as a DataLoader worker does on a GPU host;
but a dataset the rank built from its own tensors (`TensorDataset(torch.arange(n))`) hands the child fake ones.
On a GPU host the child reads their data. Here `RealInChild`, the child's only mode, gives every op real tensors in
their place, made once per tensor: the known value where there is one, zeros otherwise (beyond 16 MiB a zero-stride
view of one element, so a large dataset costs the child no memory). The child's batches are then real tensors, pickled back to the rank as any
worker's are, and a value the rank knew (labels, indices) reaches the rank's batch as it was.

A GPU tensor cannot be used in a forked child on a GPU host: CUDA refuses to initialise there, and so does the
child here, with CUDA's message.

Sending a fake tensor to another process through `torch.multiprocessing` (a DataLoader started with `spawn`, a
queue to a helper process) pickles it as `rebuild_real`'s arguments: the receiver, which runs no simulation, gets a
real CPU tensor of its shape and dtype holding the known value or zeros. A fake GPU tensor is refused there, as it
would travel by CUDA IPC, which is not simulated.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.weak import WeakIdKeyDictionary

FORK_CUDA_ERROR = ("Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use "
                   "the 'spawn' start method")


def rebuild_real(shape: tuple, dtype: str, known: Any) -> torch.Tensor:
    """A real CPU tensor of `shape` and `dtype` holding `known` (nested lists), or zeros when it is None.

    Imported by processes that run no simulation (a `spawn` child): it uses torch alone."""
    dt = getattr(torch, dtype)
    if known is not None:
        return torch.tensor(known, dtype=dt).reshape(shape)
    return torch.zeros((), dtype=dt).expand(shape)


_REAL: WeakIdKeyDictionary = WeakIdKeyDictionary()
"""The child's real tensor for each of the rank's fake ones, made once: a write to it stays, as in a real child."""

CONTIGUOUS_BYTES = 16 << 20
"""Unknown values up to this size are real zeros; larger ones one zero seen through zero strides (read-only)."""


def _real(t: Any) -> Any:
    # A Parameter made from a fake tensor is a FakeTensor (torch marks it `_is_param`): one isinstance tells both,
    # where reading `.data` of a fake tensor outside the fake mode costs milliseconds.
    if not isinstance(t, FakeTensor):
        return t
    real = _REAL.get(t)
    if real is not None:
        return real
    if t.device.type != "cpu":
        raise RuntimeError(FORK_CUDA_ERROR)
    from .values import VALUES
    if VALUES.get(t) is None and t.numel() * t.element_size() > CONTIGUOUS_BYTES:
        with unset_fake_temporarily():
            real = torch.zeros((), dtype=t.dtype).expand(tuple(t.shape))
    else:
        real = VALUES.real_or_zeros(t)
    if isinstance(t, torch.nn.Parameter):
        real = torch.nn.Parameter(real, requires_grad=t.requires_grad)
    _REAL[t] = real
    return real


class RealInChild(TorchDispatchMode):
    """Every op of a forked child runs on real tensors: the rank's fake ones replaced by their known values or
    zeros (`_real`)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(isinstance(a, FakeTensor) for a in tree_leaves((args, kwargs))):
            args, kwargs = tree_map(_real, (args, kwargs))
        return func(*args, **kwargs)


def enter_in_child() -> None:
    """Called in a forked child once the rank's modes are left."""
    RealInChild().__enter__()


def _reduce_fake(t: torch.Tensor) -> tuple:
    from .values import VALUES
    if t.device.type != "cpu":
        raise RuntimeError("phantora: a GPU tensor sent to another process (CUDA IPC through torch.multiprocessing) "
                           "is not simulated")
    return rebuild_real, (tuple(t.shape), str(t.dtype).removeprefix("torch."), VALUES.as_list(t))


def patch_sending(module: Any) -> None:
    """`torch.multiprocessing.reductions` imported: its tensor reducer, registered with the multiprocessing
    pickler for every tensor class, sends a fake tensor as `_reduce_fake` does (a real one as before)."""
    from multiprocessing.reduction import ForkingPickler

    from .values import simulated
    original = getattr(module, "reduce_tensor", None)
    if original is None or getattr(original, "__phantora__", False):
        return

    def reduce_tensor(t):
        return _reduce_fake(t) if simulated(t) else original(t)

    reduce_tensor.__phantora__ = True                     # type: ignore[attr-defined]
    module.reduce_tensor = reduce_tensor
    for cls, fn in list(ForkingPickler._extra_reducers.items()):
        if fn is original:
            ForkingPickler.register(cls, reduce_tensor)
    ForkingPickler.register(FakeTensor, reduce_tensor)
