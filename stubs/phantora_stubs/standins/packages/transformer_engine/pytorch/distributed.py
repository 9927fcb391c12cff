"""transformer_engine.pytorch.distributed: the CUDA RNG states tracker and activation checkpointing."""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch


class CudaRNGStatesTracker:
    """Named CUDA RNG states; `fork(name)` runs a block on the named state and keeps what it advanced."""

    def __init__(self) -> None:
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()

    def reset(self) -> None:
        self.states_ = {}
        self.seeds_ = set()

    def get_states(self) -> dict[str, torch.Tensor]:
        return dict(self.states_)

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self.states_ = dict(states)

    def add(self, name: str, seed: int) -> None:
        if seed in self.seeds_:
            raise Exception(f"seed {seed} already exists")
        if name in self.states_:
            raise Exception(f"cuda rng state {name} already exists")
        self.seeds_.add(seed)
        saved = torch.cuda.get_rng_state()
        torch.cuda.manual_seed(seed)
        self.states_[name] = torch.cuda.get_rng_state()
        torch.cuda.set_rng_state(saved)

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng"):
        if name not in self.states_:
            raise Exception(f"cuda rng state {name} is not added")
        saved = torch.cuda.get_rng_state()
        torch.cuda.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.cuda.get_rng_state()
            torch.cuda.set_rng_state(saved)


def checkpoint(function: Callable, *args: Any, **kwargs: Any) -> Any:
    """Activation checkpointing of `function(*args)`: torch's non-reentrant checkpoint, which recomputes the
    forward in backward as TE's does."""
    for key in ("distribute_saved_activations", "get_rng_state_tracker", "tp_group", "use_reentrant"):
        kwargs.pop(key, None)
    import torch.utils.checkpoint as ckpt
    return ckpt.checkpoint(function, *args, use_reentrant=False, **kwargs)


def is_fp8_activation_recompute_enabled() -> bool:
    return False


@contextlib.contextmanager
def activation_recompute_forward(activation_recompute: bool = False, recompute_phase: bool = False):
    """TE's marker of a recomputed forward (it matters to FP8 scaling only)."""
    yield


def get_all_rng_states() -> dict:
    return {}
