"""transformer_engine.pytorch.fp8: FP8 state. FP8 execution is not modelled: `fp8_autocast(enabled=True)` raises."""

from __future__ import annotations

import contextlib
from typing import Any

from .module.base import NotModelled


class FP8GlobalStateManager:
    """FP8 is never on in a simulated rank."""

    @classmethod
    def is_fp8_enabled(cls) -> bool:
        return False

    @classmethod
    def is_fp8_calibration(cls) -> bool:
        return False

    @classmethod
    def with_fp8_parameters(cls) -> bool:
        return False

    @classmethod
    def is_first_fp8_module(cls) -> bool:
        return False

    @classmethod
    def get_fp8_recipe(cls) -> Any:
        return None

    @classmethod
    def get_fp8_group(cls) -> Any:
        return None

    @classmethod
    def reduce_and_update_fp8_tensors(cls, *args: Any, **kwargs: Any) -> None:
        return None

    @classmethod
    def is_fp8_available(cls) -> tuple[bool, str]:
        return False, "FP8 execution is not modelled by Phantora's Transformer Engine stand-in"

    is_mxfp8_available = is_fp8_available
    is_fp8_block_scaling_available = is_fp8_available
    is_nvfp4_available = is_fp8_available


def check_fp8_support() -> tuple[bool, str]:
    return FP8GlobalStateManager.is_fp8_available()


def _refuse(enabled: bool, what: str) -> None:
    if enabled:
        raise NotModelled(f"{what}(enabled=True): FP8 execution (Transformer Engine's FP8 GEMMs, amax and scaling "
                          f"kernels) is not modelled yet; run in bf16")


@contextlib.contextmanager
def fp8_autocast(enabled: bool = True, calibrating: bool = False, fp8_recipe: Any = None, fp8_group: Any = None,
                 **kwargs: Any):
    _refuse(enabled and not calibrating, "fp8_autocast")
    yield


@contextlib.contextmanager
def fp8_model_init(enabled: bool = True, **kwargs: Any):
    _refuse(enabled, "fp8_model_init")
    yield
