"""A tensor subclass whose matmul lays out its second operand column-major (`b.t().contiguous().t()`), as torchao's
Float8 matmuls do, and the same matmul on plain tensors. Sections of the op stream are separated by
torch.cuda.synchronize()."""
import torch


class Wrapped(torch.Tensor):
    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=inner.device)

    def __init__(self, inner):
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.mm.default:
            a, b = args[0].inner, args[1].inner
            return torch.mm(a, b.t().contiguous().t())
        if func is torch.ops.aten.relu.default:           # a channels-last kernel's input
            return torch.relu(args[0].inner.contiguous(memory_format=torch.channels_last))
        raise NotImplementedError(func)


a = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
b = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()                                   # section 0: inputs
torch.mm(Wrapped(a), Wrapped(b))
torch.cuda.synchronize()                                   # section 1: through the subclass
torch.mm(a, b.t().contiguous().t())
torch.cuda.synchronize()                                   # section 2: plain
x = torch.randn(8, 64, 32, 32, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()                                   # section 3: input
torch.relu(Wrapped(x))
torch.cuda.synchronize()                                   # section 4: channels last through the subclass
print("{}")
