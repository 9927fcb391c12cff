"""The rank's configuration, read from environment variables (docs/stubs.md lists every one)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from phantora import hostcpu, routing
from phantora.software import SDPA_BACKENDS, parse_release, te_release_problem

from .errors import StubConfigError

DEFAULT_GPU = "h100-sxm-80gb"
DEFAULT_CLUSTER = "h100-hgx"     # `phantora run`'s default cluster preset


def _int(name: str, default: int | None) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise StubConfigError(f"environment variable {name}={raw!r} must be an integer") from None


def _float(name: str, default: float | None) -> float | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise StubConfigError(f"environment variable {name}={raw!r} must be a number") from None


@dataclass(frozen=True)
class StubConfig:
    rank: int                      # PHANTORA_RANK: global rank of this process
    world_size: int                # PHANTORA_WORLD_SIZE (default 1)
    local_rank: int                # PHANTORA_LOCAL_RANK (default: rank % local_devices)
    local_devices: int             # PHANTORA_LOCAL_DEVICES: GPUs per simulated host (default 8)
    gpu: str                       # PHANTORA_GPU: GPU preset name or TOML path (default h100-sxm-80gb)
    vram_bytes: int | None         # PHANTORA_VRAM_BYTES: overrides the preset's memory size
    runtime: str                   # PHANTORA_RUNTIME: "local" or an address handled by a registered factory
    cost_model: str                # PHANTORA_COSTMODEL: package providing signature_of and CostModel
    launch_overhead_s: float       # PHANTORA_LAUNCH_OVERHEAD_US (LocalRuntime only), in seconds
    epoch: float | None            # PHANTORA_EPOCH: Unix time that virtual time 0 maps to (default: start time)
    oplog: str | None              # PHANTORA_OPLOG: write the op stream as JSON lines here (LocalRuntime only)
    torch_cuda: tuple[int, int] | None = None  # PHANTORA_TORCH_CUDA: torch release whose CUDA kernel choices to emulate
    sdpa: tuple[str, ...] = ()     # PHANTORA_SDPA: forced SDPA backend order (cudnn, flash, efficient, math)
    host_cpu: str = hostcpu.DEFAULT_MODE   # PHANTORA_HOST_CPU: model (counted host work, priced) or measured
    host_costs: hostcpu.HostCosts | None = None   # PHANTORA_HOST_COSTS: py_call_ns,c_call_ns,dispatch_us,py_line_ns
    convert_costs: hostcpu.ConvertCosts | None = None   # PHANTORA_HOST_CONVERT: to_tensor_ns,infer_dtype_ns,to_list_ns
    cluster: str = DEFAULT_CLUSTER  # PHANTORA_CLUSTER: cluster preset or TOML the LocalRuntime's engine simulates
    transformer_engine: str = ""   # PHANTORA_TRANSFORMER_ENGINE: TE release the stand-in answers as ("" = none)
    routing: routing.RoutingSpec = routing.BALANCED   # PHANTORA_ROUTING: expert routing assumed (phantora/routing.py)

    @classmethod
    def from_env(cls) -> "StubConfig":
        rank = _int("PHANTORA_RANK", None)
        if rank is None:
            raise StubConfigError("PHANTORA_RANK is not set")
        world = _int("PHANTORA_WORLD_SIZE", 1)
        local_devices = _int("PHANTORA_LOCAL_DEVICES", 8)
        if world is None or world < 1:
            raise StubConfigError(f"PHANTORA_WORLD_SIZE must be at least 1, got {world}")
        if not 0 <= rank < world:
            raise StubConfigError(f"PHANTORA_RANK={rank} is outside the world of PHANTORA_WORLD_SIZE={world}")
        if local_devices is None or local_devices < 1:
            raise StubConfigError(f"PHANTORA_LOCAL_DEVICES must be at least 1, got {local_devices}")
        local_rank = _int("PHANTORA_LOCAL_RANK", rank % local_devices)
        assert local_rank is not None
        if not 0 <= local_rank < local_devices:
            raise StubConfigError(f"PHANTORA_LOCAL_RANK={local_rank} is outside 0..{local_devices - 1} "
                                  f"(PHANTORA_LOCAL_DEVICES={local_devices})")
        vram = _int("PHANTORA_VRAM_BYTES", None)
        if vram is not None and vram <= 0:
            raise StubConfigError(f"PHANTORA_VRAM_BYTES must be positive, got {vram}")
        overhead_us = _float("PHANTORA_LAUNCH_OVERHEAD_US", 4.0)
        assert overhead_us is not None
        if overhead_us < 0:
            raise StubConfigError(f"PHANTORA_LAUNCH_OVERHEAD_US must not be negative, got {overhead_us}")
        return cls(rank=rank, world_size=world, local_rank=local_rank, local_devices=local_devices,
                   gpu=os.environ.get("PHANTORA_GPU") or DEFAULT_GPU, vram_bytes=vram,
                   runtime=os.environ.get("PHANTORA_RUNTIME") or "local",
                   cost_model=os.environ.get("PHANTORA_COSTMODEL") or "phantora.costmodel",
                   launch_overhead_s=overhead_us * 1e-6, epoch=_float("PHANTORA_EPOCH", None),
                   oplog=os.environ.get("PHANTORA_OPLOG") or None, torch_cuda=_release("PHANTORA_TORCH_CUDA"),
                   sdpa=_sdpa("PHANTORA_SDPA"), host_cpu=_host_mode(), host_costs=_host_costs(),
                   convert_costs=_convert_costs(),
                   cluster=os.environ.get("PHANTORA_CLUSTER") or DEFAULT_CLUSTER,
                   transformer_engine=_te_release("PHANTORA_TRANSFORMER_ENGINE"), routing=_routing())


def _host_mode() -> str:
    try:
        return hostcpu.check_mode(os.environ.get(hostcpu.ENV_MODE) or hostcpu.DEFAULT_MODE)
    except ValueError as exc:
        raise StubConfigError(f"environment variable {hostcpu.ENV_MODE}: {exc}") from None


def _prices(env_name: str, cls):
    """Prices of the modelled host CPU (`cls`: hostcpu.HostCosts or ConvertCosts) from the launcher's environment
    variable, or the default host preset's."""
    raw = os.environ.get(env_name)
    if not raw:
        from phantora.cluster import HostSpec
        return cls.from_spec(HostSpec())
    try:
        return cls.parse_env(raw)
    except ValueError as exc:
        raise StubConfigError(str(exc)) from None


def _host_costs() -> hostcpu.HostCosts:
    """The prices of the modelled host CPU's counted work."""
    return _prices(hostcpu.ENV_COSTS, hostcpu.HostCosts)


def _convert_costs() -> hostcpu.ConvertCosts:
    """The per-element prices of conversions between Python data and tensors."""
    return _prices(hostcpu.ENV_CONVERT, hostcpu.ConvertCosts)


def _release(name: str) -> tuple[int, int] | None:
    raw = (os.environ.get(name) or "").strip()
    if not raw:
        return None
    release = parse_release(raw)
    if release is None:
        raise StubConfigError(f"environment variable {name}={raw!r} must be a torch release like 2.6 or 2.11.0")
    return release


def _te_release(name: str) -> str:
    raw = (os.environ.get(name) or "").strip()
    problem = te_release_problem(raw) if raw else None
    if problem:
        raise StubConfigError(f"environment variable {name}: {problem}")
    return raw


def _routing() -> routing.RoutingSpec:
    raw = (os.environ.get(routing.ENV) or "").strip()
    if not raw:
        return routing.BALANCED
    try:
        return routing.parse(raw)
    except routing.RoutingError as exc:
        raise StubConfigError(f"environment variable {routing.ENV}: {exc}") from None


def _sdpa(name: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in (os.environ.get(name) or "").split(",") if n.strip())
    for n in names:
        if n not in SDPA_BACKENDS:
            raise StubConfigError(f"environment variable {name}: unknown SDPA backend '{n}' "
                                  f"({', '.join(SDPA_BACKENDS)})")
    return names
