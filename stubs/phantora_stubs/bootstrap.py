"""Bootstrap of a simulated rank process (called by stubs/sitecustomize.py when PHANTORA_RANK is set).

`install()`, before the user's program runs and without importing torch:
1. reads the configuration from the environment (config.py) and loads the GPU preset;
2. creates the runtime from `RUNTIME_FACTORIES` (key: `PHANTORA_RUNTIME`, or the scheme of an address such as
   `tcp://host:port`, or "remote" for any other value);
3. fills in the torchrun variables the program may read (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
   MASTER_ADDR, MASTER_PORT) where they are missing;
4. replaces the `time` module's clocks with the rank's virtual clock;
5. loads the fake CUDA library (building it once per torch install); on a CUDA build of torch too, unless
   PHANTORA_FAKE_CUDA=cpu-only (its guard then replaces the real one right after `import torch`), so that a rank
   never touches the real GPU;
6. arranges that, as soon as `torch` has been imported, the torch-side pieces are installed: torch.cuda stand-ins,
   the global fake mode and the interceptor, the Meta kernels of SyncBatchNorm's CUDA statistics ops
   (syncbn_ops.py), the torch.distributed backend, the post-import patches of
   DeviceMesh, flex attention and torch.distributed.set_timeout, and the framework stand-ins' import hooks
   (standins/).

Before all this, a rank started by `phantora run` arranges to die with its launcher (Linux) and, when
PHANTORA_STACK_FILE is set, to write its Python stacks there on SIGUSR2 (errors.install_stack_dump), which the launcher
puts in its hang, mismatch and deadlock reports.

Child processes of a rank (DataLoader workers started with spawn, compile workers, a multiprocessing Manager)
inherit PHANTORA_RANK; they are recognised by PHANTORA_RANK_PID (the rank's own pid) and run as plain processes,
with only the triton stand-in (so that re-importing the program's main module finds what the rank found).
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import os
import sys
from typing import Any, Callable

from phantora.gpus import load_gpu

from . import build, clock, context
from .config import StubConfig
from .runtime import LocalRuntime, Runtime, local_cluster


def _local_factory(config: StubConfig, gpu: Any, capacity: int) -> Runtime:
    """The rank simulated in process by the engine, on the cluster PHANTORA_CLUSTER with the configured world,
    host size and GPU (runtime.local_cluster)."""
    cluster = local_cluster(config.world_size, config.local_devices, config.gpu, config.cluster)
    scale = float(os.environ.get("PHANTORA_CPU_TIME_SCALE") or 1.0)     # as remote.remote_factory reads it
    return LocalRuntime(capacity_bytes=capacity, rank=config.rank, world_size=config.world_size,
                        local_rank=config.local_rank, launch_overhead_s=config.launch_overhead_s,
                        cpu_time_scale=scale, cluster=cluster, oplog=config.oplog, record=False)


def _remote_factory(config: StubConfig, gpu: Any, capacity: int) -> Runtime:
    from .remote import remote_factory
    return remote_factory(config, gpu, capacity)


RUNTIME_FACTORIES: dict[str, Callable[[StubConfig, Any, int], Runtime]] = {
    "local": _local_factory, "unix": _remote_factory, "remote": _remote_factory}
"""Runtime constructors by key: "local" (one rank in process) and "unix" (an engine server address, unix://PATH)."""


def _runtime_key(value: str) -> str:
    if value in RUNTIME_FACTORIES:
        return value
    if "://" in value:
        scheme = value.split("://", 1)[0]
        if scheme in RUNTIME_FACTORIES:
            return scheme
    return "remote"


def make_runtime(config: StubConfig, gpu: Any, capacity: int) -> Runtime:
    key = _runtime_key(config.runtime)
    factory = RUNTIME_FACTORIES.get(key)
    if factory is None:
        from .errors import StubConfigError
        raise StubConfigError(f"PHANTORA_RUNTIME={config.runtime!r}: no runtime '{key}' is registered "
                              f"(known: {', '.join(sorted(RUNTIME_FACTORIES))})")
    return factory(config, gpu, capacity)


# ---- post-import hooks ----------------------------------------------------------------------------------------------

_HOOKS: dict[str, list[Callable[[Any], None]]] = {}


class _HookedLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, name: str):
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        for hook in _HOOKS.pop(self._name, []):
            hook(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _HOOKS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _HookedLoader(spec.loader, fullname)
                return spec
        return None


_FINDER = _PostImportFinder()


def when_imported(name: str, hook: Callable[[Any], None]) -> None:
    """Run `hook(module)` once `name` has been imported (now, if it already is)."""
    mod = sys.modules.get(name)
    if mod is not None and getattr(getattr(mod, "__spec__", None), "_initializing", False) is False:
        hook(mod)
        return
    _HOOKS.setdefault(name, []).append(hook)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


# ---- install --------------------------------------------------------------------------------------------------------

def is_rank_child() -> bool:
    pid = os.environ.get("PHANTORA_RANK_PID")
    return pid is not None and pid != str(os.getpid())


def install() -> context.Context | None:
    """Set the rank up (idempotent); None in a child process of a rank."""
    if context.CTX is not None:
        return context.CTX
    if is_rank_child():
        # A child started with spawn (a multiprocessing Manager, a DataLoader worker) imports the program's main
        # module again: it finds the packages its rank found, the triton stand-in included, as on a GPU machine.
        from . import standins, triton_stub
        when_imported("torch", lambda torch: triton_stub.install())
        standins.provide(os.environ.get("PHANTORA_TRANSFORMER_ENGINE", "").strip())
        return None
    from .errors import die_with_launcher, install_stack_dump
    die_with_launcher(os.environ.get("PHANTORA_LAUNCHER_PID"))
    if os.environ.get("PHANTORA_STACK_FILE"):
        install_stack_dump(os.environ["PHANTORA_STACK_FILE"])      # the launcher's hang / deadlock reports
    config = StubConfig.from_env()
    from . import standins
    standins.provide(config.transformer_engine)
    gpu = load_gpu(config.gpu)
    capacity = config.vram_bytes or gpu.memory_bytes
    runtime = make_runtime(config, gpu, capacity)
    ctx = context.Context(config=config, runtime=runtime, gpu=gpu)
    context.CTX = ctx
    os.environ["PHANTORA_RANK_PID"] = str(os.getpid())
    os.environ["PHANTORA_LOCAL_DEVICES"] = str(config.local_devices)    # read by the fake CUDA library
    for key, value in (("RANK", config.rank), ("WORLD_SIZE", config.world_size),
                       ("LOCAL_RANK", config.local_rank),
                       ("LOCAL_WORLD_SIZE", min(config.local_devices, config.world_size)),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", 29500)):
        os.environ.setdefault(key, str(value))
    clock.install(lambda: ctx.runtime, config.epoch)
    from .exitwait import settle_autograd_threads
    atexit.register(settle_autograd_threads)     # runs last: autograd threads done before finalization (exitwait.py)
    atexit.register(runtime.close)
    if "torch" in sys.modules:
        raise RuntimeError("phantora stubs must be installed before torch is imported")
    torch_install = build.find_torch()
    ctx.extras["cuda_build"] = torch_install.cuda_build
    ctx.lib = build.ensure_fake_cuda()
    when_imported("torch", lambda torch: install_torch(ctx))
    from . import filelocks
    when_imported("filelock", filelocks.patch)   # waits for other ranks' file locks advance no time (filelocks.py)
    from . import dataset_caches
    when_imported("datasets", dataset_caches.patch)   # transforms computed, not loaded from earlier runs' caches
    return ctx


def install_torch(ctx: context.Context) -> None:
    """The torch-side pieces (runs right after `import torch` completes)."""
    if ctx.dev is not None:
        return
    from . import cuda_install, dist_ddp, dist_install, fake
    from .comm import GroupRegistry
    from .costing import Coster
    from .devstate import DeviceState
    from .memtrack import MemoryTracker

    if ctx.extras.get("cuda_build") and ctx.lib is not None:
        ctx.lib.phantora_force_guard()      # a CUDA build: libtorch_cuda registered its own guard meanwhile
    ctx.dev = DeviceState(ctx.lib, ctx.config.local_devices)
    ctx.coster = Coster(ctx.gpu, ctx.runtime.intern_signature, ctx.config.cost_model)
    ctx.mem = MemoryTracker(ctx.runtime, ctx.dev, ctx.gpu.display_name)
    ctx.groups = GroupRegistry(ctx.runtime, ctx.dev)
    cuda_install.install(ctx)
    fake.install(ctx)
    from . import grad_fence
    grad_fence.install()        # autograd.grad returns once the engine let go of the gradients (grad_fence.py)
    from . import syncbn_ops
    ctx.extras["syncbn_ops"] = syncbn_ops.install()    # SyncBatchNorm's CUDA statistics kernels on fake tensors
    dist_install.install(ctx)
    when_imported("torch.distributed.device_mesh", fake.patch_device_mesh)
    when_imported("torch.nn.attention.flex_attention", fake.patch_flex_attention)
    from . import pipeline_layout          # the program's pipeline stages against `--ranks auto`'s plan
    when_imported("torch.distributed.pipelining.stage", pipeline_layout.patch_torch_pipelining)
    from . import standins
    standins.install(when_imported)
    when_imported("torch.nn.parallel.distributed", dist_ddp.patch_ddp_module)
    from . import saving
    when_imported("safetensors", saving.patch_safetensors_root)
    when_imported("safetensors.torch", saving.patch_safetensors)
    from . import dcp_async
    when_imported("torch.distributed.checkpoint.state_dict_saver", dcp_async.patch_state_dict_saver)
    fake.patch_distributed(sys.modules["torch.distributed"])
    clock.METER.reset()
