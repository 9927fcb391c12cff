"""Installs the torch.distributed backend of a simulated rank (collectives become ops, nothing travels).

`install(ctx)` registers `PhantoraProcessGroup` (a Python `dist.ProcessGroup` subclass) under the backend name
"phantora", and makes the names "nccl" and "gloo" (and so the default backend of every device) create it too, by
standing in for `ProcessGroupNCCL` / `ProcessGroupGloo` inside `torch.distributed.distributed_c10d`. `get_backend()`
still answers the name the program asked for. The pieces:
- `dist_groups.py`: the process-group classes;
- `dist_group_creation.py`: init_process_group without other ranks, group ids for new_group / split_group;
- `dist_emit.py`: launching ops on a group's communication stream, the work handle;
- `dist_collectives.py`: the collectives;
- `dist_p2p.py`: send/recv, batch_isend_irecv and the coalescing manager as NCCL groups;
- `dist_objects.py`: the object collectives and object point-to-point;
- `dist_ddp.py`: DistributedDataParallel's start-up helpers.
"""

from __future__ import annotations

import sys
from datetime import timedelta

import torch.distributed as dist

from .dist_ddp import broadcast_coalesced, verify_param_shapes
from .dist_emit import install_backward_join
from .dist_group_creation import _wrap_init, _wrap_new_group, _wrap_new_process_group_helper, split_group
from .dist_groups import PhantoraGlooGroup, PhantoraNCCLGroup, _create_phantora_pg
from .dist_objects import _OBJECT_COLLECTIVES
from .dist_p2p import _wrap_batch_isend_irecv


# ---- installation ---------------------------------------------------------------------------------------------------

REBOUND = ("init_process_group",)
"""c10d functions the stubs replace that modules import by name (`torch.distributed.device_mesh` imports
`init_process_group`): a module loaded before the replacement would keep the original."""


def _rebind(originals: dict, c10d) -> None:
    """Point every loaded module's reference to an original c10d function at its replacement. Without it,
    `init_device_mesh` with no process group yet called the original `init_process_group`, whose TCP rendezvous
    waited for ranks that a run simulating only some of them never starts (`--ranks auto`): a silent hang."""
    swaps = {id(old): (old, getattr(c10d, name)) for name, old in originals.items()
             if old is not None and getattr(c10d, name) is not old}
    if not swaps:
        return
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict) or module is c10d:
            continue
        for key, value in list(namespace.items()):
            hit = swaps.get(id(value))
            if hit is not None and hit[0] is value:
                namespace[key] = hit[1]

def install(ctx) -> None:
    """Register the backend and patch torch.distributed (idempotent)."""
    if not dist.is_available() or ctx.extras.get("distributed_installed"):
        return
    c10d = dist.distributed_c10d
    originals = {name: getattr(c10d, name, None) for name in REBOUND}
    if "phantora" not in dist.Backend.backend_list:
        dist.Backend.register_backend("phantora", _create_phantora_pg, devices=["cpu", "cuda"])
    install_backward_join()                     # collectives' futures asked for in a backward pass (dist_emit.py)
    c10d.ProcessGroupNCCL = PhantoraNCCLGroup
    dist.ProcessGroupNCCL = PhantoraNCCLGroup
    c10d.ProcessGroupGloo = PhantoraGlooGroup
    dist.ProcessGroupGloo = PhantoraGlooGroup
    if not isinstance(getattr(c10d, "default_pg_nccl_timeout", None), timedelta):
        c10d.default_pg_nccl_timeout = timedelta(minutes=10)       # ProcessGroupNCCL's default on CUDA builds
    c10d._NCCL_AVAILABLE = True
    c10d._GLOO_AVAILABLE = True

    def is_nccl_available() -> bool:
        return True

    def is_gloo_available() -> bool:
        return True

    c10d.is_nccl_available = is_nccl_available
    dist.is_nccl_available = is_nccl_available
    c10d.is_gloo_available = is_gloo_available
    dist.is_gloo_available = is_gloo_available
    dist.Backend.default_device_backend_map["cuda"] = "nccl"
    _wrap_init(c10d)
    _wrap_new_process_group_helper(c10d)
    _wrap_new_group(c10d)
    _wrap_batch_isend_irecv(c10d)
    c10d.split_group = split_group
    dist.split_group = split_group
    for name, fn in _OBJECT_COLLECTIVES.items():
        setattr(c10d, name, fn)
        setattr(dist, name, fn)
    dist._broadcast_coalesced = broadcast_coalesced
    import torch.distributed.utils as dist_utils
    dist_utils._verify_param_shape_across_processes = verify_param_shapes
    _rebind(originals, c10d)
    ctx.extras["distributed_installed"] = True
