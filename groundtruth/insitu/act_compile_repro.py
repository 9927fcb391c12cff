"""An eager DTensor whose local tensor is an AsyncCollectiveTensor (the output of a RowwiseParallel embedding,
which redistributes with async_op=True) fed to a block compiled with torch.compile(fullgraph=True), then backward.
Plain PyTorch on CPU with gloo, no Phantora:

    torchrun --standalone --nproc-per-node 2 groundtruth/insitu/act_compile_repro.py

prints "OK rank N" on torch 2.11; on torch 2.13 the backward fails in DTensor's Redistribute.backward
("'Tensor' object has no attribute '_local_tensor'"): the compiled region's backward hands it a plain gradient.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))


class Block(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.a = nn.Linear(d, 4 * d, bias=False)
        self.b = nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        return x + self.b(torch.relu(self.a(x)))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(128, 64)
        self.blk = Block()
        self.out = nn.Linear(64, 128, bias=False)

    def forward(self, t):
        return self.out(self.blk(self.emb(t)))


m = Model()
parallelize_module(m, mesh, {"emb": RowwiseParallel(input_layouts=Replicate())})
parallelize_module(m.blk, mesh, {"a": ColwiseParallel(), "b": RowwiseParallel()})
m.blk.compile(fullgraph=True)
t = torch.randint(0, 128, (2, 16))
for _ in range(2):
    m(t).float().pow(2).mean().backward()
print("OK rank", dist.get_rank(), flush=True)
dist.destroy_process_group()
