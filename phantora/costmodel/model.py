"""The cost model: one kernel signature on one GPU model -> Cost, from the best source available.

Order of sources for a signature that launches a kernel:

1. PROFILE   - this GPU's profile database has the signature;
2. MEASURED  - live measurement on the local CUDA GPU, when asked for and present (results kept in memory);
3. PROFILE   - (detail "bf16 twin") an fp16 matmul absent from the profile, as the same matmul in bf16 where the
               GPU's two tensor rates are one (`_bf16_twin`), exact or interpolated; then (detail "interpolated")
               a matmul absent from the profile, interpolated from its nearest measured GEMMs of the same dtype
               (phantora.costmodel.interpolate);
4. CROSS_GPU - another GPU's profile has the signature (or a near GEMM): its duration scaled by the ratio of the two
               GPUs' roofline estimates (for the same silicon at a lower power limit, with compute slowed by
               the clock the limit leaves: costmodel/power.py);
5. ROOFLINE  - FLOPs and bytes against this GPU's peaks and per-family efficiencies.

Every source is a time between two CUDA events around the op, run alone (or fitted on such times); what the op adds
to a busy stream is that less the events' own overhead (the GPU preset's `event_overhead_us`, measured by
phantora.probes.streamprobe; the efficiency table's for roofline costs and GPUs not measured), and at least the
stream time of as many empty kernels as the op launches (the roofline's per-kernel latency sheds the overhead
once per launch). Durations returned are stream times; host-device copies keep the link model's time.

Views, metadata, allocation-only ops and collectives cost nothing here (`is_view=True`, source NONE); collectives
are the network model's. Every result is cached by signature (the same signature repeats thousands of times a run).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..engine.ops import CostSource
from ..errors import PhantoraError
from ..gpus import GPUSpec, load_gpu, same_device
from .cost import Cost
from .families import work
from .interpolate import MatmulInterpolator, gemm_shape
from .power import compute_slowdown
from .profiledb import summarize
from .roofline import EfficiencyTable, RooflineModel
from .signature import Signature

if TYPE_CHECKING:
    from .profiledb import ProfileDB


class CostModel:
    """Costs kernel signatures on `gpu` (see module docstring for the order of sources)."""

    def __init__(self, gpu: GPUSpec, profile_db: "ProfileDB | None" = None, measure_live: bool = False,
                 fallback_gpu_db: "ProfileDB | None" = None, *, fallback_gpu: GPUSpec | None = None,
                 table: EfficiencyTable | None = None, interpolate: bool = True, live_repeats: int = 20,
                 allow_other_live_gpu: bool = False):
        self.gpu = gpu
        if profile_db is not None and profile_db.gpu != gpu.name:
            raise PhantoraError(f"profile database {profile_db.path} was measured on '{profile_db.gpu}', not on "
                                f"'{gpu.name}'; pass it as fallback_gpu_db to scale it across GPUs")
        self.profile_db = profile_db
        self.fallback_db = fallback_gpu_db
        self.fallback_roofline: RooflineModel | None = None
        other = None
        # Compute-bound work is slower where this GPU is the profiled silicon at a lower power limit
        # (costmodel/power.py); 1.0 otherwise.
        self.power_slowdown = 1.0
        if fallback_gpu_db is not None:
            other = fallback_gpu or load_gpu(fallback_gpu_db.gpu)
            if other.name != fallback_gpu_db.gpu:
                raise PhantoraError(f"fallback profile {fallback_gpu_db.path} is of '{fallback_gpu_db.gpu}', "
                                    f"but fallback_gpu is '{other.name}'")
            self.power_slowdown = compute_slowdown(other, gpu)
        self.roofline = RooflineModel(gpu, table, compute_slowdown=self.power_slowdown)
        if other is not None:
            # Same architecture: same efficiencies, so the ratio is the hardware's (peaks, bandwidth, power
            # limit). Otherwise each GPU is modelled with its own architecture's table.
            same_arch = other.arch.lower() == gpu.arch.lower()
            self.fallback_roofline = RooflineModel(other, self.roofline.table if same_arch else None)
        table = self.roofline.table
        self.event_overhead_s = _event_overhead_s(gpu, table)
        self.fallback_event_overhead_s = (_event_overhead_s(other, self.fallback_roofline.table)
                                          if other is not None and self.fallback_roofline is not None else 0.0)
        self._roofline_overhead_s = table.event_overhead_s
        self._empty_kernel_s = max(table.latency_s - table.event_overhead_s, 0.0)   # an empty kernel on a stream
        self._interp = MatmulInterpolator(profile_db) if (profile_db is not None and interpolate) else None
        self._fallback_interp = MatmulInterpolator(fallback_gpu_db) if (fallback_gpu_db is not None and interpolate) \
            else None
        self.live_repeats = live_repeats
        self.measure_live = False
        if measure_live:
            from .measure import cuda_available, local_device_name

            if cuda_available():
                local = local_device_name()
                if not allow_other_live_gpu and gpu.display_name and not same_device(local, gpu.display_name):
                    raise PhantoraError(f"live measurement would time '{local}', but the simulated GPU is "
                                        f"'{gpu.display_name}'; simulate the local GPU, or pass "
                                        "allow_other_live_gpu=True to accept its timings")
                self.measure_live = True
        self.live: dict[str, list[float]] = {}    # signature key -> measured samples (us), for saving to a profile
        self._cache: dict[Signature, Cost] = {}
        self._key_cache: dict[str, Cost] = {}
        self.stats: dict[CostSource, int] = {}    # uncached estimates per source

    def estimate(self, sig: Signature) -> Cost:
        """The cost of one launch of `sig` on this GPU (cached)."""
        c = self._cache.get(sig)
        if c is None:
            c = self._cache[sig] = self._estimate(sig)
        return c

    def estimate_key(self, key: str) -> Cost:
        """Same as `estimate`, for a signature given by its key (replay's signature table)."""
        c = self._key_cache.get(key)
        if c is None:
            c = self._key_cache[key] = self.estimate(Signature.from_key(key))
        return c

    def clear_cache(self) -> None:
        self._cache.clear()
        self._key_cache.clear()

    def _estimate(self, sig: Signature) -> Cost:
        w = work(sig)
        if w.is_view:
            c = self.roofline.cost_of(w)
            self._count(c.source)
            return c
        c = self._from_sources(sig, w)
        self._count(c.source)
        return c

    def _count(self, source: CostSource) -> None:
        self.stats[source] = self.stats.get(source, 0) + 1

    def _from_sources(self, sig: Signature, w) -> Cost:
        if w.xfer:
            # a copy across the host link: the link's time. Profiles time signatures on one GPU, where a host-device
            # copy's signature runs as a copy within the GPU (measure.py drops `xfer`): never a link's time.
            return self.roofline.cost_of(w)
        key = sig.key()
        if self.profile_db is not None:
            rec = self.profile_db.lookup(key)
            if rec is not None:
                return Cost(self._on_stream(rec.median_us * 1e-6, w, self.event_overhead_s), w.flops, w.nbytes,
                            w.family, CostSource.PROFILE)
        if self.measure_live and not w.xfer:
            from .measure import measure_signature

            samples = self.live.get(key)
            if samples is None:
                try:
                    samples = measure_signature(sig, self.live_repeats)
                except PhantoraError:
                    samples = []
                self.live[key] = samples
            if samples:
                return Cost(self._on_stream(summarize(samples).median_us * 1e-6, w, self.event_overhead_s), w.flops,
                            w.nbytes, w.family, CostSource.MEASURED)
        twin = self._bf16_twin(sig)
        if twin is not None and self.profile_db is not None:
            rec = self.profile_db.lookup(twin.key())
            if rec is not None:
                return Cost(self._on_stream(rec.median_us * 1e-6, w, self.event_overhead_s), w.flops, w.nbytes,
                            w.family, CostSource.PROFILE, detail="bf16 twin")
        if self._interp is not None:
            for s, detail in (((twin, "bf16 twin, interpolated"),) if twin is not None else ()) + \
                    ((sig, "interpolated"),):
                r = self._interp.estimate(s, self.roofline)
                if r is not None:
                    return Cost(self._on_stream(r[0], w, self.event_overhead_s), w.flops, w.nbytes, w.family,
                                CostSource.PROFILE, detail=detail)
        if self.fallback_db is not None and self.fallback_roofline is not None:
            rec = self.fallback_db.lookup(key)
            other_t, detail = None, ""
            if rec is not None:
                other_t = rec.median_us * 1e-6
            elif self._fallback_interp is not None:
                r = self._fallback_interp.estimate(sig, self.fallback_roofline)
                if r is not None:
                    other_t, detail = r[0], "interpolated"
            if other_t is not None:
                here = self.roofline.duration(w)
                there = self.fallback_roofline.duration(w)
                if there > 0:
                    t = self._on_stream(other_t, w, self.fallback_event_overhead_s) * here / there
                    return Cost(t, w.flops, w.nbytes, w.family, CostSource.CROSS_GPU, detail=detail)
        c = self.roofline.cost_of(w)
        if w.xfer:                  # a host-device copy: the link model's time, not a kernel's event time
            return c
        # the roofline's latency is an event time per kernel: each launch sheds the overhead
        return replace(c, duration_s=self._on_stream(c.duration_s, w, self._roofline_overhead_s * w.launches))

    def _bf16_twin(self, sig: Signature) -> Signature | None:
        """The bf16 signature of an fp16 GEMM, on a GPU whose fp16 and bf16 tensor rates are one (every preset's:
        A100, H100, H200, B200, RTX 3090 with fp32 accumulation); None otherwise. On an H200, 12 training shapes
        timed in both dtypes took 0.92 to 1.06 times as long in fp16 as in bf16 (groundtruth/gemm/), so this GPU's
        own bf16 measurements, dense in every profile, cost an fp16 GEMM better than a sparse fp16 table
        interpolated far or another GPU's fp16 record scaled across (an H100 run's fp16 GEMMs were 10-25% slow so)."""
        if "float16" not in sig.dtypes or gemm_shape(sig) is None:
            return None
        peaks = self.gpu.peak_tflops
        if peaks.get("fp16", 0.0) <= 0 or peaks.get("fp16") != peaks.get("bf16"):
            return None
        return replace(sig, dtypes=tuple("bfloat16" if d == "float16" else d for d in sig.dtypes))

    def _on_stream(self, event_s: float, w, overhead_s: float) -> float:
        """A CUDA-event time of an op as the time it holds a busy stream (module docstring); events around the whole
        op add their overhead once, whatever the kernels it launches."""
        if event_s <= 0.0 or w.xfer:
            return event_s
        return max(event_s - overhead_s, w.launches * self._empty_kernel_s)


def _event_overhead_s(gpu: GPUSpec, table: EfficiencyTable) -> float:
    """What CUDA events add to a kernel timed alone on `gpu`: its preset's, else its efficiency table's."""
    return gpu.event_overhead_us * 1e-6 if gpu.event_overhead_us is not None else table.event_overhead_s
