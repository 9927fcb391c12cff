"""Prints, as one JSON line, the data pointers of a few CUDA tensors, views and storages of a simulated rank."""
import json

import torch

a = torch.empty(100, device="cuda")
b = torch.empty(100, device="cuda")
view = a[10:]
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).cuda()
print(json.dumps({"a": a.data_ptr(), "b": b.data_ptr(), "view": view.data_ptr(),
                  "a_storage": a.untyped_storage().data_ptr(), "view_storage": view.untyped_storage().data_ptr(),
                  "empty": torch.empty(0, device="cuda").data_ptr(),
                  "params": [p.untyped_storage().data_ptr() for p in model.parameters()]}), flush=True)
