"""A training loop fed by a DataLoader with worker processes (PIN: "pin" or "nopin"): prints, as one JSON line, the
labels of the batches the rank received (real values: workers are separate processes computing on real tensors)."""
import json
import sys

import torch
from torch.utils.data import DataLoader, Dataset


class Numbers(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.randn(32), i


def main():
    model = torch.nn.Linear(32, 4).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Numbers(), batch_size=8, num_workers=2, pin_memory=sys.argv[1] == "pin")
    labels = []
    for x, y in loader:
        labels.append(y.tolist())
        x = x.cuda(non_blocking=True)
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    torch.cuda.synchronize()
    print(json.dumps({"labels": labels}), flush=True)


if __name__ == "__main__":
    main()
