"""transformer_engine.common.recipe: FP8 recipe descriptions, as plain records (frameworks subclass and build them;
running FP8 is refused by `fp8_autocast`)."""

from __future__ import annotations

import enum
from typing import Any


class _Format(enum.Enum):
    E4M3 = "E4M3"
    E5M2 = "E5M2"
    HYBRID = "HYBRID"


Format = _Format


class Recipe:
    """A recipe: keeps its keyword arguments as attributes."""

    def __init__(self, *args: Any, **kwargs: Any):
        for key, value in kwargs.items():
            setattr(self, key, value)

    def delayed(self) -> bool:
        return isinstance(self, DelayedScaling)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({vars(self)})"


class DelayedScaling(Recipe):
    def __init__(self, margin: int = 0, fp8_format: Any = Format.HYBRID, amax_history_len: int = 1024,
                 amax_compute_algo: str = "max", **kwargs: Any):
        super().__init__(margin=margin, fp8_format=fp8_format, amax_history_len=amax_history_len,
                         amax_compute_algo=amax_compute_algo, **kwargs)


class Float8CurrentScaling(Recipe):
    pass


class Float8BlockScaling(Recipe):
    pass


class MXFP8BlockScaling(Recipe):
    pass


class NVFP4BlockScaling(Recipe):
    pass
