"""Datasets a rank builds from its own tensors, read by DataLoader workers, and the samples a shuffled sampler
picks. Prints one `RESULT {json}` line with what the rank received. Runs as well without Phantora (plain PyTorch on
the CPU, RANK and WORLD_SIZE from the environment): the two outputs must agree.

`python dataloader_datasets.py [cuda]`: with `cuda`, also a dataset of GPU tensors read by a forked worker (on a
GPU host: CUDA refuses to initialise in the forked child)."""
import json
import os
import sys

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def stack_collate(items):
    """A collate function that makes new tensors from the samples (as transformers' default_data_collator)."""
    return torch.stack([i[0] for i in items]), torch.tensor([int(i[1]) for i in items])


def main():
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.manual_seed(0)
    out = {}
    # tensors the rank made, with known values, read by two forked workers, batches collated into new tensors
    x = torch.arange(64, dtype=torch.float32).reshape(16, 4) + rank
    y = torch.arange(16) * 10
    loader = DataLoader(TensorDataset(x, y), batch_size=4, num_workers=2, collate_fn=stack_collate)
    out["fork"] = [[a.tolist(), b.tolist()] for a, b in loader]
    # a shuffled DistributedSampler over more samples than small tensors keep values for
    big = TensorDataset(torch.arange(20000).reshape(10000, 2), torch.randint(0, 7, (10000,)))
    sampler = DistributedSampler(big, num_replicas=world, rank=rank, shuffle=True, seed=3)
    loader = DataLoader(big, batch_size=4, sampler=sampler, num_workers=2)
    it = iter(loader)
    out["sampled"] = [[t.tolist() for t in next(it)] for _ in range(2)]
    out["shuffled"] = next(iter(DataLoader(list(range(10000)), batch_size=6, shuffle=True))).tolist()
    out["after"] = torch.randint(0, 1000, (3,)).tolist()       # the CPU generator's state after all that
    # a worker started with spawn: the dataset travels pickled
    loader = DataLoader(TensorDataset(x, y), batch_size=8, num_workers=1, multiprocessing_context="spawn")
    out["spawn"] = [[a.tolist(), b.tolist()] for a, b in loader]
    if sys.argv[1:] == ["cuda"]:
        loader = DataLoader(TensorDataset(x.cuda()), batch_size=4, num_workers=1)
        try:
            next(iter(loader))
            out["cuda"] = "no error"
        except RuntimeError as e:
            out["cuda"] = str(e)
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
