"""dcp.async_save of an FSDP2 model's state dict, for tests/test_dcp_async.py: with the default stager (a thread
writes), and with a stager that pins and stages asynchronously (a process writes, as TorchTitan's
async_with_pinned_mem does). Prints what each returned, how long it held the calling thread, and what a load reads."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType, AsyncSaveResponse
from torch.distributed.fsdp import fully_shard

root = sys.argv[1]
dist.init_process_group(os.environ.get("BACKEND", "cpu:gloo,cuda:nccl"))
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)]).cuda()
fully_shard(model)
nbytes = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
res = {"rank": rank, "bytes": nbytes}
try:
    for mode in ("thread", "pinned"):
        path = os.path.join(root, mode)
        t0 = time.perf_counter()
        if mode == "thread":
            ret = dcp.async_save({"model": model.state_dict()}, checkpoint_id=path)
            done = [ret.result() is None]
        else:
            stager = DefaultStager(StagingOptions(True, True, True, True))
            ret = dcp.async_save({"model": model.state_dict()}, checkpoint_id=path, async_stager=stager,
                                 async_checkpointer_type=AsyncCheckpointerType.PROCESS)
            done = [isinstance(ret, AsyncSaveResponse), ret.staging_completion.result() is None,
                    ret.upload_completion.result() is None]
        res[mode] = {"done": done, "held_s": time.perf_counter() - t0, "files": sorted(os.listdir(path))}
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=os.path.join(root, "thread"))
    res["loaded"] = sorted(state["model"])
except Exception as exc:  # noqa: BLE001 - the test checks the message
    res["error"] = f"{type(exc).__name__}: {exc}"
print("RESULT " + json.dumps(res))
