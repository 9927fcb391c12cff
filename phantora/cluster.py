"""Cluster presets: how many nodes of which GPU, linked how.

One TOML file per cluster in presets/clusters/ (see docs/clusters.md for every key). Loading validates the file into
the typed dataclasses below; every error names the file and the key. `apply_overrides` implements `--set key=value`
for any field (e.g. `net.inter_node_gbps=100`).
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import PresetError
from .gpus import GPUSpec, device_bytes, load_gpu
from .paths import presets_dir
from .software import SDPA_BACKENDS, parse_release, te_release_problem
from .tomlconf import build, check_number, read_toml, to_table

INTRA_KINDS = ("nvswitch", "nvlink-mesh", "pcie")
NET_TOPOLOGIES = ("rail-leaf-spine", "leaf-spine", "single-switch")


@dataclass
class IntraSpec:
    """The fabric inside one node."""
    kind: str = "nvswitch"                 # nvswitch | nvlink-mesh | pcie
    nvlink_links_per_gpu: int = 0          # NVLink links of each GPU (to the switches, or spread over its mesh peers)
    nvlink_link_gbyte_per_s: float = 20.6  # achievable GB/s per link and direction (NCCL topo.h: SM80 20.0, SM90 20.6)
    pcie_gbyte_per_s: float = 24.0         # achievable GB/s per direction between a GPU and its PCIe switch
    hop_latency_us: float = 0.0            # per-hop link latency in the topology (for raw flows; collectives and
                                           # transfers use NCCL's latency terms instead)

    def validate(self) -> None:
        if self.kind not in INTRA_KINDS:
            raise PresetError(f"'{self.kind}' is not one of {', '.join(INTRA_KINDS)}", key="intra.kind")
        if self.kind != "pcie" and self.nvlink_links_per_gpu <= 0:
            raise PresetError(f"an {self.kind} node needs nvlink_links_per_gpu > 0", key="intra.nvlink_links_per_gpu")
        check_number(self.nvlink_links_per_gpu, "intra.nvlink_links_per_gpu", nonnegative=True)
        check_number(self.nvlink_link_gbyte_per_s, "intra.nvlink_link_gbyte_per_s", positive=True)
        check_number(self.pcie_gbyte_per_s, "intra.pcie_gbyte_per_s", positive=True)
        check_number(self.hop_latency_us, "intra.hop_latency_us", nonnegative=True)

    @property
    def gpu_nvlink_bytes_per_s(self) -> float:
        return self.nvlink_links_per_gpu * self.nvlink_link_gbyte_per_s * 1e9


@dataclass
class NetSpec:
    """The scale-out network between nodes."""
    nics_per_node: int = 0                 # 0 for a single-node cluster
    inter_node_gbps: float = 400.0         # line rate of each NIC, Gb/s
    nic_efficiency: float = 0.96           # achievable fraction of line rate (NCCL topo.h: 12 GB/s per 100 Gb/s)
    topology: str = "rail-leaf-spine"      # rail-leaf-spine | leaf-spine | single-switch
    nodes_per_leaf: int = 32               # nodes under one leaf switch (per rail for rail-leaf-spine)
    spines: int = 8                        # spine switches; every leaf has one uplink to each
    oversubscription: float = 1.0          # leaf downlink : uplink bandwidth ratio (1.0 = non-blocking)
    hop_latency_us: float = 1.0            # per switch hop link latency (raw flows only, as intra.hop_latency_us)

    def validate(self) -> None:
        if self.topology not in NET_TOPOLOGIES:
            raise PresetError(f"'{self.topology}' is not one of {', '.join(NET_TOPOLOGIES)}", key="net.topology")
        if self.nics_per_node < 0:
            raise PresetError("must be >= 0", key="net.nics_per_node")
        check_number(self.inter_node_gbps, "net.inter_node_gbps", positive=True)
        check_number(self.nic_efficiency, "net.nic_efficiency")
        if not 0 < self.nic_efficiency <= 1:
            raise PresetError("must be in (0, 1]", key="net.nic_efficiency")
        check_number(self.oversubscription, "net.oversubscription")
        check_number(self.hop_latency_us, "net.hop_latency_us", nonnegative=True)
        if self.oversubscription < 1:
            raise PresetError("must be >= 1 (1 is non-blocking)", key="net.oversubscription")
        if self.nodes_per_leaf < 1:
            raise PresetError("must be >= 1", key="net.nodes_per_leaf")
        if self.spines < 1:
            raise PresetError("must be >= 1", key="net.spines")

    @property
    def nic_bytes_per_s(self) -> float:
        return self.inter_node_gbps / 8 * 1e9 * self.nic_efficiency


HOST_RATE_TABLES = ("copy_gbps", "downcast_gbps", "upcast_gbps", "elementwise_gbps", "reduction_gbps", "cpu_adam_gbps",
                    "storage_read_gbps", "storage_write_gbps")


def check_rate_table(table: Any, key: str) -> None:
    """A list of [threads, GB/s] points with increasing thread counts."""
    if not isinstance(table, list) or not table:
        raise PresetError("expected a list of [threads, GB/s] pairs", key=key)
    last = 0
    for i, point in enumerate(table):
        if not isinstance(point, list) or len(point) != 2:
            raise PresetError(f"entry {i}: expected [threads, GB/s], got {point!r}", key=key)
        check_number(point[0], f"{key}[{i}][0]", positive=True)
        check_number(point[1], f"{key}[{i}][1]", positive=True)
        if point[0] <= last:
            raise PresetError(f"entry {i}: thread counts must increase", key=key)
        last = point[0]


def host_rates_env(host: "HostSpec") -> str:
    """The host's rate tables as the ranks read them (PHANTORA_HOST_MEMORY_GBPS):
    `name=threads:gbps,threads:gbps;name=...` (stubs/phantora_stubs/host_compute.py)."""
    return ";".join(f"{key[:-5]}=" + ",".join(f"{t!r}:{g!r}" for t, g in getattr(host, key))
                    for key in HOST_RATE_TABLES)


@dataclass
class HostSpec:
    """The CPU side of each rank (docs/host-cpu.md)."""
    launch_overhead_us: float = 4.0        # CPU time the runtime spends per kernel launch
    # launches a CUDA stream holds; the next launch blocks the host until the stream's oldest completes (0: no limit;
    # measured on an H200, driver 580: groundtruth/streams/README.md, "The launch queue")
    launch_queue: int = 1022
    cpu_time_scale: float = 1.0            # the framework's CPU time between ops is multiplied by this
    # prices of the modelled host CPU (phantora/hostcpu.py), per unit of work counted between two ops
    # (groundtruth/hostcpu/fit-h200x2.json: on that data a call's cost is in the lines it runs, and built-in calls
    # move with the rest; both are counted, priced 0)
    py_call_ns: float = 0.0                # a Python function call, beyond its lines
    c_call_ns: float = 0.0                 # a call of a built-in (C) function
    dispatch_us: float = 2.374             # an aten op through PyTorch's dispatcher (kernel, view or metadata op)
    py_line_ns: float = 357.8              # a Python line run (a line starting, or starting again after a jump back)
    # a compiled region's host work that the simulation does not run (torch.compile: Inductor's wrapper code, which the
    # simulation replaces; groundtruth/hostcpu/h200x2-compile, docs/compile.md "Host time of a compiled step")
    generated_launch_us: float = 27.8      # launching a kernel Inductor generated, beyond launch_overhead_us
    compiled_call_us: float = 213.0        # a call of a compiled region (forward or backward), beyond its launches
    # per element converted between Python data and a tensor (modelled host CPU; groundtruth/hostcpu/conversions-h200/)
    to_tensor_ns: float = 57.7             # torch.tensor / as_tensor / asarray of a Python sequence or scalar
    infer_dtype_ns: float = 67.8           # more, when no dtype is given (the data is walked to infer it)
    to_list_ns: float = 14.4               # Tensor.tolist()
    cpu_cores: int = 16                    # host threads of a rank when OMP_NUM_THREADS is not set
    # host memory traffic (bytes read + written per second, GB/s) of a rank's CPU work on large host tensors, by
    # thread count: [threads, GB/s] points, interpolated; each point the median over every run of one process at that
    # thread count on 2 x H200 hosts of 32 cores (element-wise: the mean of mul_'s and add_'s medians;
    # groundtruth/deepspeed/host_tables.py prints them from the data)
    copy_gbps: list = field(default_factory=lambda: [[1, 10.8], [4, 36.0], [8, 61.1], [16, 81.2], [32, 98.0]])  # copy_
    downcast_gbps: list = field(default_factory=lambda: [[1, 9.09], [4, 30.0], [8, 51.9], [16, 75.1], [32, 104.9]])
    upcast_gbps: list = field(default_factory=lambda: [[1, 3.05], [4, 7.11], [8, 10.6], [16, 15.5], [32, 15.4]])
    elementwise_gbps: list = field(default_factory=lambda: [[1, 18.5], [4, 54.9], [8, 97.1], [16, 125.8],
                                                            [32, 157.8]])                            # mul_, add_
    reduction_gbps: list = field(default_factory=lambda: [[1, 10.2], [4, 9.83], [8, 8.77], [16, 9.18],
                                                          [32, 10.3]])                               # norm, sum...
    cpu_adam_gbps: list = field(default_factory=lambda: [[1, 19.1], [4, 65.7], [8, 75.6], [16, 119.3],
                                                         [32, 151.1]])                               # CPU Adam
    # the host's local storage as ZeRO-Infinity's NVMe offload uses it, by I/O threads (`intra_op_parallelism`):
    # DeepSpeed's own async I/O handle moving 2.5 GiB tensors, three writes then three reads, on a one-H200 host
    # whose storage is a virtual disk (groundtruth/deepspeed/h200-nvme/run2/aio.json, the means); a host of local
    # NVMe drives sets its own
    storage_read_gbps: list = field(default_factory=lambda: [[1, 1.88], [2, 1.90], [4, 1.86], [8, 1.74]])
    storage_write_gbps: list = field(default_factory=lambda: [[1, 1.87], [2, 1.99], [4, 2.10], [8, 1.88]])

    def validate(self) -> None:
        for key in ("launch_overhead_us", "py_call_ns", "c_call_ns", "dispatch_us", "py_line_ns", "to_tensor_ns",
                    "infer_dtype_ns", "to_list_ns", "generated_launch_us", "compiled_call_us"):
            check_number(getattr(self, key), f"host.{key}", nonnegative=True)
        check_number(self.cpu_time_scale, "host.cpu_time_scale", nonnegative=True)
        check_number(self.cpu_cores, "host.cpu_cores", positive=True)
        check_number(self.launch_queue, "host.launch_queue", nonnegative=True)
        for key in HOST_RATE_TABLES:
            check_rate_table(getattr(self, key), f"host.{key}")


@dataclass
class SoftwareSpec:
    """The CUDA software stack of the simulated run, for the kernel choices the ranks make (docs/stubs.md)."""
    torch_cuda: str = ""                   # torch release ("2.6") whose CUDA kernel choices are emulated; "" = the ranks' own
    sdpa: list[str] = field(default_factory=list)   # SDPA backends in priority order, overriding torch's and the script's
    transformer_engine: str = ""           # Transformer Engine release the ranks import (a stand-in); "" = none

    def validate(self) -> None:
        if self.torch_cuda and parse_release(self.torch_cuda) is None:
            raise PresetError(f"'{self.torch_cuda}' is not a torch release like 2.6 or 2.11.0",
                              key="software.torch_cuda")
        if self.transformer_engine:
            problem = te_release_problem(self.transformer_engine)
            if problem:
                raise PresetError(problem, key="software.transformer_engine")
        for b in self.sdpa:
            if b not in SDPA_BACKENDS:
                raise PresetError(f"unknown SDPA backend '{b}' ({', '.join(SDPA_BACKENDS)})", key="software.sdpa")


@dataclass
class NcclSpec:
    """Knobs of the collective model (NCCL_ALGO / NCCL_PROTO equivalents)."""
    algorithms: list[str] = field(default_factory=lambda: ["ring", "tree"])
    protocols: list[str] = field(default_factory=lambda: ["LL", "LL128", "Simple"])
    channels: int = 0                      # NCCL channels used for its bandwidth caps; 0 = derived from the topology
    # A collective's kernels and the compute kernels beside them on one GPU slow each other (engine/core.py,
    # docs/network-model.md "Collectives and kernels sharing a GPU"): the factors by which each runs longer while
    # they overlap. Compute and memory: fitted on in-situ timelines of real two-GPU FSDP steps on 2 x H200 against
    # the same steps on one GPU (groundtruth/insitu/sharing_fit.py --engine over h200x2-nccl/, h200x2-fsdp/ and the
    # simulated steps of h200x2-engine/: the factors that give those steps their whole extra kernel time over the
    # time the engine's collectives overlap);
    # the collectives' factor read off the 8B step's NCCL kernels matched in order to the network model's times
    # for their sizes (docs/network-model.md). 1 turns the effect off.
    sharing_compute: float = 1.80          # a compute-bound kernel (GEMM, attention) beside a collective
    sharing_memory: float = 1.27           # an HBM-bound kernel beside a collective
    sharing_collective: float = 1.10       # a collective beside compute kernels

    def validate(self) -> None:
        for key in ("sharing_compute", "sharing_memory", "sharing_collective"):
            check_number(getattr(self, key), f"nccl.{key}", nonnegative=True)
            if getattr(self, key) < 1:
                raise PresetError("a slowdown factor must be at least 1 (1: no slowdown)", key=f"nccl.{key}")
        for a in self.algorithms:
            if a not in ("ring", "tree"):
                raise PresetError(f"unknown algorithm '{a}' (ring, tree)", key="nccl.algorithms")
        for p in self.protocols:
            if p not in ("LL", "LL128", "Simple"):
                raise PresetError(f"unknown protocol '{p}' (LL, LL128, Simple)", key="nccl.protocols")
        if not self.algorithms or not self.protocols:
            raise PresetError("at least one algorithm and one protocol", key="nccl")
        check_number(self.channels, "nccl.channels", nonnegative=True)


@dataclass
class StreamsSpec:
    """Kernels of one GPU's streams running side by side share it (engine/core.py `Engine._side_by_side`;
    docs/cost-model.md, "Streams of one GPU"): the factor by which a kernel runs longer while a kernel of another
    stream of its GPU runs beside it, by the two kernels' kinds (compute-bound: GEMMs, attention; memory-bound: the
    rest). Measured on an H200 with kernels that each fill the GPU (`python -m phantora.probes.twostreamprobe`, two
    runs, groundtruth/streams/): a GEMM beside a GEMM x1.92-1.98; a GEMM beside a copy or an add x1.05-1.09; a copy
    or an add beside a GEMM x3.41-3.51; a copy or an add beside another x1.64-2.38 (mean 1.97). Used for every GPU.
    Kernels shorter than `min_us` neither slow nor are slowed (4-11 µs kernels, which fill a part of the GPU, gave
    0.7-3.6 from run to run). 1 turns the effect off."""
    compute_beside_compute: float = 1.95
    compute_beside_memory: float = 1.07
    memory_beside_compute: float = 3.47
    memory_beside_memory: float = 1.97
    min_us: float = 20.0

    def validate(self) -> None:
        for key in ("compute_beside_compute", "compute_beside_memory", "memory_beside_compute",
                    "memory_beside_memory"):
            check_number(getattr(self, key), f"streams.{key}", positive=True)
            if getattr(self, key) < 1:
                raise PresetError("a slowdown factor must be at least 1 (1: no slowdown)", key=f"streams.{key}")
        check_number(self.min_us, "streams.min_us", nonnegative=True)

    @property
    def active(self) -> bool:
        return any(getattr(self, k) > 1 for k in ("compute_beside_compute", "compute_beside_memory",
                                                   "memory_beside_compute", "memory_beside_memory"))


@dataclass
class DeviceMemorySpec:
    """GPU memory a process holds outside PyTorch's caching allocator (phantora/engine/devmem.py). Defaults measured
    on H200 with CUDA 13.0, torch 2.11, NCCL 2.28.9, NVLS off (groundtruth/devmem/)."""
    context_mib: float = 619.0             # the CUDA context, with the libraries' kernels loaded
    libraries_mib: float = 84.0            # cuBLAS/cuBLASLt (66 MiB) and cuDNN (16 MiB) workspaces and handles
    nccl_first_comm_mib: float = 840.0     # the first NCCL communicator of a process (its first collective)
    nccl_comm_mib: float = 485.0           # each further communicator (a process group's first collective)
    nccl_p2p_mib: float = 446.0            # a communicator's point-to-point buffers (its first send/recv)

    def validate(self) -> None:
        for key in ("context_mib", "libraries_mib", "nccl_first_comm_mib", "nccl_comm_mib", "nccl_p2p_mib"):
            check_number(getattr(self, key), f"device_memory.{key}", nonnegative=True)


@dataclass
class ClusterSpec:
    name: str
    gpu: str                               # GPU preset name
    gpus_per_node: int
    nodes: int = 1
    description: str = ""
    intra: IntraSpec = field(default_factory=IntraSpec)
    net: NetSpec = field(default_factory=NetSpec)
    host: HostSpec = field(default_factory=HostSpec)
    nccl: NcclSpec = field(default_factory=NcclSpec)
    software: SoftwareSpec = field(default_factory=SoftwareSpec)
    device_memory: DeviceMemorySpec = field(default_factory=DeviceMemorySpec)
    streams: StreamsSpec = field(default_factory=StreamsSpec)
    vram_gib: float = 0.0                  # overrides the GPU preset's memory when > 0
    source: str = ""                       # where the topology figures come from

    def validate(self) -> None:
        if self.nodes < 1:
            raise PresetError("must be >= 1", key="nodes")
        if self.gpus_per_node < 1:
            raise PresetError("must be >= 1", key="gpus_per_node")
        if self.nodes > 1 and self.net.nics_per_node < 1:
            raise PresetError("a multi-node cluster needs net.nics_per_node >= 1", key="net.nics_per_node")
        if self.net.nics_per_node > 0 and self.gpus_per_node % self.net.nics_per_node and \
                self.net.nics_per_node % self.gpus_per_node:
            raise PresetError("gpus_per_node and nics_per_node must divide one another", key="net.nics_per_node")
        if self.intra.kind == "nvlink-mesh" and self.gpus_per_node > 8:
            raise PresetError("an NVLink mesh holds at most 8 GPUs", key="gpus_per_node")
        check_number(self.vram_gib, "vram_gib", nonnegative=True)
        self.software.validate()
        self.host.validate()
        self.device_memory.validate()
        self.streams.validate()

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def gpu_spec(self) -> GPUSpec:
        return load_gpu(self.gpu)

    def vram_bytes(self) -> int:
        if self.vram_gib > 0:
            return device_bytes(self.vram_gib)
        return self.gpu_spec().memory_bytes

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def to_table(self) -> dict[str, Any]:
        return to_table(self)


def cluster_dir() -> Path:
    return presets_dir() / "clusters"


def list_clusters() -> list[str]:
    return sorted(p.stem for p in cluster_dir().glob("*.toml"))


def check_node_options(nodes: int | None, gpus_per_node: int | None) -> None:
    """Refuse a `--nodes` / `--gpus-per-node` that is not a whole number >= 1, naming the option."""
    for option, value in (("--nodes", nodes), ("--gpus-per-node", gpus_per_node)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise PresetError(f"must be a whole number >= 1, got {value!r}", file=option)


def load_cluster(name_or_path: str, *, nodes: int | None = None, gpus_per_node: int | None = None,
                 gpu: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> ClusterSpec:
    """A cluster preset by name or TOML path, with command-line overrides applied and the result validated."""
    p = Path(name_or_path)
    if p.suffix == ".toml":
        if not p.exists():
            raise PresetError("file not found", file=str(p))
        path = p
    else:
        path = cluster_dir() / f"{name_or_path}.toml"
        if not path.exists():
            raise PresetError(f"unknown cluster preset '{name_or_path}'; known: {', '.join(list_clusters())}")
    check_node_options(nodes, gpus_per_node)
    table = read_toml(path)
    spec = build(ClusterSpec, table, file=str(path))
    changes: list[str] = list(overrides)
    if nodes is not None:
        changes.append(f"nodes={nodes}")
    if gpus_per_node is not None:
        changes.append(f"gpus_per_node={gpus_per_node}")
        # fewer GPUs than the preset's NICs per node: keep one NIC per GPU (rails) unless told otherwise
        if 0 < gpus_per_node < spec.net.nics_per_node and not any(c.startswith("net.nics_per_node")
                                                                   for c in overrides):
            changes.append(f"net.nics_per_node={gpus_per_node}")
    if gpu is not None:
        changes.append(f"gpu={gpu!r}" if not gpu.startswith(("'", '"')) else f"gpu={gpu}")
    if changes:
        spec = apply_overrides(spec, changes, origin=str(path))
    spec.gpu_spec()  # the GPU must exist
    return spec


def software_overrides(torch_cuda: str | None, sdpa: str | None, transformer_engine: str | None = None) -> list[str]:
    """`--set` overrides for the `--torch-cuda VERSION`, `--sdpa a,b,c` and `--transformer-engine VERSION` options
    of `phantora run`."""
    out = []
    if transformer_engine:
        out.append(f"software.transformer_engine={transformer_engine.strip()!r}")
    if torch_cuda:
        out.append(f"software.torch_cuda={torch_cuda.strip()!r}")
    if sdpa:
        names = [n.strip() for n in sdpa.split(",") if n.strip()]
        out.append("software.sdpa=[" + ", ".join(repr(n) for n in names) + "]")
    return out


def cluster_from_table(table: dict[str, Any], origin: str = "<table>") -> ClusterSpec:
    """A cluster from a plain table (as stored in a trace's metadata)."""
    return build(ClusterSpec, table, file=origin)


def _parse_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # a bare word is a string


def apply_overrides(spec: ClusterSpec, assignments: list[str] | tuple[str, ...], origin: str = "--set") -> ClusterSpec:
    """Apply `key=value` assignments (dotted keys reach nested tables) and re-validate."""
    table = spec.to_table()
    for item in assignments:
        if "=" not in item:
            raise PresetError(f"'{item}' is not key=value", file="--set")
        key, _, raw = item.partition("=")
        key = key.strip()
        parts = key.split(".")
        node: Any = table
        for i, part in enumerate(parts[:-1]):
            if not isinstance(node, dict) or part not in node or not isinstance(node[part], dict):
                raise PresetError(f"no such table '{'.'.join(parts[:i + 1])}'", file="--set", key=key)
            node = node[part]
        leaf = parts[-1]
        if leaf not in node:
            known = ", ".join(sorted(k if not isinstance(v, dict) else k + ".*" for k, v in node.items()))
            raise PresetError(f"no such field (known here: {known})", file="--set", key=key)
        value = _parse_value(raw.strip())
        if isinstance(node[leaf], float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        node[leaf] = value
    return build(ClusterSpec, table, file=f"{origin} with --set")


def replace(spec: ClusterSpec, **changes: Any) -> ClusterSpec:
    return dataclasses.replace(spec, **changes)
