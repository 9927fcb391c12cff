"""Host compute on tensors that hold no data: what an op on large host tensors costs the rank's CPU.

A rank's host tensors are fake like its device tensors (ZeRO-Offload keeps the fp32 master weights, gradients and
optimizer state there). An aten op on them does no work in the simulation; on a real host it streams the tensors
through memory. Such an op (every tensor on the host, at least `MIN_BYTES` touched) charges the rank's CPU clock
the bytes it reads and writes (its distinct tensor arguments read, its results written) over the host preset's rate
for its kind of op at the rank's thread count (`[host]` of the cluster preset, tables of [threads, GB/s]: medians of
runs of groundtruth/deepspeed/host_ops_bench.py and cpu_adam_bench.py on real hosts, host_tables.py; interpolated
linearly and flat past their ends):

- `copy_gbps`: copies that keep the dtype (`copy_`, `_to_copy`, `clone`, `cat`...);
- `downcast_gbps`, `upcast_gbps`: copies to a narrower dtype (fp32 to bf16: 9.1 GB/s on one thread) and to a wider
  one (bf16 to fp32: 3.1 GB/s), which run slower than a copy (10.8 GB/s) and each other; a conversion between dtypes of
  one size is charged as a copy (not measured);
- `reduction_gbps`: reductions (`norm`, `sum`, `max`...; PyTorch runs a whole-tensor norm on one thread);
- `elementwise_gbps`: every other op (`mul_`, `add_`, `addcdiv_`...);
- `cpu_adam_gbps`: DeepSpeed's CPU optimizers (standins/deepspeed.py).

A blocking copy between host and device that changes the dtype converts on the host and is charged at the cast's
rate too; a non-blocking one converts on the GPU (PyTorch's rule; interceptor).
The threads are `OMP_NUM_THREADS` when set (torchrun and `phantora run` set 1 for several processes per node), else
the preset's `cpu_cores`. Ranks sharing a host do not slow each other here: two single-threaded processes do not
measurably on a host, eight do (copies at about 0.85 of one alone, CPU Adam 0.76 or lower; docs/host-cpu.md). Smaller
host ops cost only their dispatch (docs/host-cpu.md).
"""

from __future__ import annotations

import os

from .errors import StubConfigError, note_once

MIN_BYTES = 1 << 20
ENV_RATES = "PHANTORA_HOST_MEMORY_GBPS"     # "copy=1:10.8,4:36.0,8:61.1;downcast=...;..." from the launcher
ENV_CORES = "PHANTORA_HOST_CPU_CORES"
KINDS = ("copy", "downcast", "upcast", "elementwise", "reduction", "cpu_adam", "storage_read", "storage_write")

_COPY_OPS = frozenset({"copy_", "_to_copy", "clone", "cat", "stack", "contiguous", "_copy_from", "fill_", "zero_",
                       "zeros_like", "ones_like", "full_like", "index_select", "gather", "flatten_dense_tensors"})
_REDUCTION_OPS = frozenset({"norm", "linalg_vector_norm", "sum", "mean", "max", "min", "amax", "amin", "prod",
                            "_foreach_norm", "all", "any", "isinf", "isnan", "isfinite", "dot", "vdot"})


def kind_of(op_name: str) -> str:
    if op_name in _COPY_OPS:
        return "copy"
    if op_name in _REDUCTION_OPS:
        return "reduction"
    return "elementwise"


def cast_kind(src_dtype, dst_dtype) -> str:
    """The kind of a copy from one dtype to another: "copy", "downcast" (to fewer bytes per element) or "upcast"."""
    a, b = src_dtype.itemsize, dst_dtype.itemsize
    return "copy" if a == b else ("downcast" if b < a else "upcast")


def parse_rates(text: str) -> dict[str, list[tuple[float, float]]]:
    rates = {}
    try:
        for section in text.split(";"):
            name, points_text = section.split("=")
            points = []
            for part in points_text.split(","):
                t, g = part.split(":")
                points.append((float(t), float(g)))
            rates[name.strip()] = points
    except ValueError:
        rates = {}
    ok = set(rates) == set(KINDS) and all(
        points and all(t > 0 and g > 0 for t, g in points) and all(b[0] > a[0] for a, b in zip(points, points[1:]))
        for points in rates.values())
    if not ok:
        raise StubConfigError(f"environment variable {ENV_RATES}={text!r}: expected "
                              f"{';'.join(k + '=threads:GB/s,...' for k in KINDS)} with positive, increasing "
                              "thread counts")
    return rates


def interpolate(points, x: float) -> float:
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


class HostMemory:
    """The rank's host memory rates (bytes/s) by kind of op, at its thread count."""

    def __init__(self, environ=os.environ):
        raw = environ.get(ENV_RATES)
        cores = environ.get(ENV_CORES)
        if not raw or not cores:
            from phantora.cluster import HostSpec, host_rates_env
            raw = raw or host_rates_env(HostSpec())
            cores = cores or str(HostSpec().cpu_cores)
        rates = parse_rates(raw)
        threads = environ.get("OMP_NUM_THREADS") or cores
        self.source = "OMP_NUM_THREADS" if environ.get("OMP_NUM_THREADS") else "the cluster's [host] cpu_cores"
        try:
            self.threads = max(1, int(threads))
        except ValueError:
            raise StubConfigError(f"OMP_NUM_THREADS / {ENV_CORES}: {threads!r} is not an integer") from None
        self.tables = rates
        self.bytes_per_s = {k: interpolate(points, self.threads) * 1e9 for k, points in rates.items()}

    def storage_seconds(self, nbytes: float, write: bool, threads: int) -> float:
        """A request of `nbytes` to or from the host's local storage served by `threads` I/O threads (DeepSpeed's
        async I/O, standins/deepspeed.py)."""
        return nbytes / (interpolate(self.tables["storage_write" if write else "storage_read"], threads) * 1e9)

    def seconds(self, nbytes: float, kind: str) -> float:
        hint = ("; for a host of other cores: --set host.cpu_cores=N" if self.source.endswith("cpu_cores")
                else "")
        note_once("host-compute", f"host compute (ops on large host tensors, such as ZeRO-Offload's CPU optimizer) "
                                  f"runs at {self.threads} thread(s) per rank ({self.source}) at the measured [host] "
                                  f"rates{hint} (docs/host-cpu.md, \"Host compute\")")
        return nbytes / self.bytes_per_s[kind]


_MEMORY: HostMemory | None = None


def memory() -> HostMemory:
    global _MEMORY
    if _MEMORY is None:
        _MEMORY = HostMemory()
    return _MEMORY


_WRITE_ONLY = frozenset({"copy_", "fill_", "zero_"})   # the first argument is written, not read


def op_bytes(name: str, inputs, outputs) -> int:
    """Bytes an op on fake host tensors streams: its distinct tensor arguments read (not the destination of a copy
    or fill) and its results written (an in-place op reads and writes its tensor); 0 if any tensor is on a device,
    or holds real data."""
    from torch._subclasses.fake_tensor import FakeTensor
    if name in _WRITE_ONLY:
        inputs = inputs[1:]
    elif name == "_copy_from":          # _copy_from(self, dst): the second argument is written, not read
        inputs = inputs[:1] + inputs[2:]
    total = 0
    for group in (inputs, outputs):
        seen = set()
        for t in group:
            if not isinstance(t, FakeTensor) or t.device.type != "cpu":
                return 0
            if id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
    return total
