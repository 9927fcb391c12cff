"""transformer_engine.pytorch.float8_tensor (TE 1.x name of the FP8 tensor class)."""

from .tensor import Float8Tensor  # noqa: F401
