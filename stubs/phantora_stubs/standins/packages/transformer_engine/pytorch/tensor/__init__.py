"""transformer_engine.pytorch.tensor: the quantized tensor classes (no tensor is ever one: FP8 is not modelled)."""

import torch


class QuantizedTensor(torch.Tensor):
    pass


class Float8Tensor(QuantizedTensor):
    pass
