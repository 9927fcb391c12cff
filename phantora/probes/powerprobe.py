"""Measure how one CUDA GPU spends power: `python -m phantora.probes.powerprobe --out DIR [--step-cmd ...]`.

For each probe (a kernel run back to back for a few seconds) it reports the average power from NVML's energy
counter, the SM clock and the throttle reasons sampled every 10 ms, the core voltage where the driver reports it,
and the probe's achieved FLOP/s and bytes/s. The probes span the activity of a training step: a spinning
single-thread kernel (the GPU awake and doing nothing), HBM-bound copies and additions, bf16 GEMMs whose inputs
toggle more or fewer bits (random, ±1, half zeros, zeros: the same work at different power), and flash and cuDNN
attention. With `--step-cmd`, a whole training command is run as well and sampled over its steady part.

`python -m phantora.probes.powerprobe --table DIR/power.json --trace STEP.h5 --gpu PRESET` prints the GPU preset's
`[power]` table: STEP.h5 is Phantora's trace of the same step command (`phantora run --nodes 1 --gpus-per-node 1
--trace STEP.h5 -- <step command>`), which gives the step's compute-bound share of kernel time.

The results (DIR/power.json) feed the GPU preset's `[power]` table that phantora.costmodel.power reads. Changes
nothing on the GPU: the power limit and clocks are read, never set.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..errors import PhantoraError

NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2


class NVML:
    """The few NVML calls needed, through ctypes (no Python binding required)."""

    def __init__(self, index: int = 0):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self._ok(self.lib.nvmlInit_v2())
        self.h = ctypes.c_void_p()
        self._ok(self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.h)))

    @staticmethod
    def _ok(rc: int) -> None:
        if rc != 0:
            raise RuntimeError(f"NVML call failed with status {rc}")

    def _uint(self, fn, *args) -> int:
        v = ctypes.c_uint()
        self._ok(getattr(self.lib, fn)(self.h, *args, ctypes.byref(v)))
        return v.value

    def energy_mj(self) -> int:
        v = ctypes.c_ulonglong()
        self._ok(self.lib.nvmlDeviceGetTotalEnergyConsumption(self.h, ctypes.byref(v)))
        return v.value

    def power_w(self) -> float:
        return self._uint("nvmlDeviceGetPowerUsage") / 1000.0

    def limit_w(self) -> float:
        return self._uint("nvmlDeviceGetEnforcedPowerLimit") / 1000.0

    def clock_mhz(self, which: int = NVML_CLOCK_SM) -> int:
        return self._uint("nvmlDeviceGetClockInfo", ctypes.c_int(which))

    def max_clock_mhz(self, which: int = NVML_CLOCK_SM) -> int:
        return self._uint("nvmlDeviceGetMaxClockInfo", ctypes.c_int(which))

    def temperature_c(self) -> int:
        return self._uint("nvmlDeviceGetTemperature", ctypes.c_int(0))

    def throttle_reasons(self) -> int:
        v = ctypes.c_ulonglong()
        self._ok(self.lib.nvmlDeviceGetCurrentClocksThrottleReasons(self.h, ctypes.byref(v)))
        return v.value


REASONS = {0x1: "idle", 0x2: "app_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal",
           0x40: "hw_thermal", 0x80: "hw_power_brake"}


def voltage_mv() -> float | None:
    """The graphics (core) voltage nvidia-smi reports, or None where the driver does not report it."""
    try:
        text = subprocess.run(["nvidia-smi", "-q", "-d", "VOLTAGE"], capture_output=True, text=True,
                              timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in text.splitlines():
        if "Graphics" in line and "mV" in line:
            try:
                return float(line.split(":")[1].split("mV")[0])
            except (IndexError, ValueError):
                return None
    return None


class Sampler(threading.Thread):
    """Samples SM clock, power and throttle reasons every `period` seconds (and voltage every 20th sample)."""

    def __init__(self, nvml: NVML, period: float = 0.01):
        super().__init__(daemon=True)
        self.nvml, self.period = nvml, period
        self.samples: list[tuple] = []
        self.volts: list[tuple[float, float]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        n = 0
        while not self._halt.is_set():
            t = time.perf_counter()
            self.samples.append((t, self.nvml.clock_mhz(), self.nvml.power_w(), self.nvml.throttle_reasons(),
                                 self.nvml.clock_mhz(NVML_CLOCK_MEM)))
            n += 1
            if n % 20 == 1:
                v = voltage_mv()
                if v is not None:
                    self.volts.append((time.perf_counter(), v))
            time.sleep(self.period)

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def window(self, t0: float, t1: float) -> dict:
        s = [x for x in self.samples if t0 <= x[0] <= t1]
        v = [x[1] for x in self.volts if t0 <= x[0] <= t1]
        if not s:
            return {}
        reasons = 0
        for x in s:
            reasons |= x[3]
        return {"sm_clock_mhz": statistics.median(x[1] for x in s), "sm_clock_mean_mhz": statistics.fmean(x[1] for x in s),
                "mem_clock_mhz": statistics.median(x[4] for x in s),
                "power_sampled_w": statistics.fmean(x[2] for x in s), "samples": len(s),
                "throttle": [name for bit, name in REASONS.items() if reasons & bit],
                "voltage_mv": statistics.median(v) if v else None}


def probes(torch):
    """(name, setup) pairs; setup() returns (run, flops per run, bytes per run)."""
    dev = "cuda"
    bf16 = torch.bfloat16

    def gemm(m, n, k, fill):
        def setup():
            a = torch.empty(m, k, device=dev, dtype=bf16)
            b = torch.empty(k, n, device=dev, dtype=bf16)
            for t in (a, b):
                if fill == "random":
                    t.normal_()
                elif fill == "zeros":
                    t.zero_()
                elif fill == "sign":
                    t.copy_(torch.sign(torch.randn_like(t)))
                elif fill == "half":
                    t.normal_().mul_(torch.rand_like(t) < 0.5)
            c = torch.empty(m, n, device=dev, dtype=bf16)
            return (lambda: torch.mm(a, b, out=c)), 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n)
        return setup

    def copy(nbytes):
        def setup():
            x = torch.empty(nbytes // 2, device=dev, dtype=bf16).normal_()
            y = torch.empty_like(x)
            return (lambda: y.copy_(x)), 0.0, 2.0 * nbytes
        return setup

    def add(nbytes):
        def setup():
            x = torch.empty(nbytes // 2, device=dev, dtype=bf16).normal_()
            y = torch.empty_like(x).normal_()
            z = torch.empty_like(x)
            return (lambda: torch.add(x, y, out=z)), nbytes / 2.0, 3.0 * nbytes
        return setup

    def attention(backend, b=2, h=32, s=8192, d=128):
        def setup():
            from torch.nn.attention import SDPBackend, sdpa_kernel
            import torch.nn.functional as F

            q, k, v = (torch.randn(b, h, s, d, device=dev, dtype=bf16, requires_grad=True) for _ in range(3))
            go = torch.randn(b, h, s, d, device=dev, dtype=bf16)
            be = getattr(SDPBackend, backend)

            def run():
                with sdpa_kernel([be]):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    o.backward(go)
            # causal: half of the 4·b·h·s²·d forward FLOPs; backward 2.5x forward
            fwd = 4.0 * b * h * s * s * d / 2
            return run, 3.5 * fwd, 4 * 2.0 * b * h * s * d * 2
        return setup

    def spin():
        def setup():
            return (lambda: torch.cuda._sleep(1_000_000)), 0.0, 0.0
        return setup

    return [("spin", spin()),
            ("copy_2GiB", copy(2 << 30)), ("add_2GiB", add(2 << 30)),
            ("gemm8192_random", gemm(8192, 8192, 8192, "random")),
            ("gemm8192_half", gemm(8192, 8192, 8192, "half")),
            ("gemm8192_sign", gemm(8192, 8192, 8192, "sign")),
            ("gemm8192_zeros", gemm(8192, 8192, 8192, "zeros")),
            ("gemm_ffn_16384x14336x4096_random", gemm(16384, 14336, 4096, "random")),
            ("gemm_4096_random", gemm(4096, 4096, 4096, "random")),
            ("attn_flash_b2h32s8192d128", attention("FLASH_ATTENTION")),
            ("attn_cudnn_b2h32s8192d128", attention("CUDNN_ATTENTION"))]


def measure(nvml: NVML, sampler: Sampler, torch, name: str, setup, seconds: float) -> dict:
    run, flops, nbytes = setup()
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    t_end = time.perf_counter() + 1.0           # settle: let the power controller reach its steady clock
    while time.perf_counter() < t_end:
        run()
        torch.cuda.synchronize()
    n = 0
    e0, t0 = nvml.energy_mj(), time.perf_counter()
    t_stop = t0 + seconds
    while True:
        for _ in range(4):
            run()
        n += 4
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        if t1 >= t_stop:
            break
    e1 = nvml.energy_mj()
    dt = t1 - t0
    rec = {"probe": name, "seconds": dt, "runs": n, "power_w": (e1 - e0) / 1000.0 / dt,
           "run_us": dt / n * 1e6, "tflops": flops * n / dt / 1e12, "gbyte_per_s": nbytes * n / dt / 1e9,
           "temperature_c": nvml.temperature_c()}
    rec.update(sampler.window(t0, t1))
    return rec


def measure_duty(nvml: NVML, sampler: Sampler, torch, gemms: int, spin_us: float, seconds: float) -> dict:
    """The random-data 8192³ GEMM in bursts of `gemms`, each followed by a spin of `spin_us`: the same kernel at
    the clocks that different average loads leave it. The GEMM's own time (CUDA events) gives its clock (its
    throughput is proportional to the SM clock); the energy counter, less the spin's power over the spin's time,
    gives its power."""
    run, flops, _ = dict(probes(torch))["gemm8192_random"]()
    spin_cycles = int(spin_us * nvml.max_clock_mhz())
    start = [torch.cuda.Event(enable_timing=True) for _ in range(64)]
    stop = [torch.cuda.Event(enable_timing=True) for _ in range(64)]

    def burst(i):
        start[i].record()
        for _ in range(gemms):
            run()
        stop[i].record()
        if spin_cycles:
            torch.cuda._sleep(spin_cycles)

    t_settle = time.perf_counter() + 1.5
    while time.perf_counter() < t_settle:
        for i in range(8):
            burst(i)
        torch.cuda.synchronize()
    gemm_s = 0.0
    n = 0
    e0, t0 = nvml.energy_mj(), time.perf_counter()
    while True:
        for i in range(64):
            burst(i)
        torch.cuda.synchronize()
        gemm_s += sum(a.elapsed_time(b) for a, b in zip(start, stop)) / 1000.0
        n += 64 * gemms
        t1 = time.perf_counter()
        if t1 - t0 >= seconds:
            break
    e1 = nvml.energy_mj()
    dt = t1 - t0
    rec = {"probe": f"duty_gemm8192_random_x{gemms}_spin{int(spin_us)}us", "seconds": dt, "runs": n,
           "power_w": (e1 - e0) / 1000.0 / dt, "gemm_seconds": gemm_s, "gemm_share": gemm_s / dt,
           "gemm_tflops": flops * n / gemm_s / 1e12, "temperature_c": nvml.temperature_c()}
    rec.update(sampler.window(t0, t1))
    return rec


def measure_step(nvml: NVML, sampler: Sampler, cmd: str, skip_s: float) -> dict:
    """Runs a training command; averages power over its run after the first `skip_s` seconds."""
    e = {}
    t_start = time.perf_counter()
    proc = subprocess.Popen(shlex.split(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    marks = []
    out_lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        out_lines.append(line)
        marks.append((time.perf_counter(), nvml.energy_mj()))
    proc.wait()
    t_end = time.perf_counter()
    steady = [m for m in marks if m[0] >= t_start + skip_s]
    if len(steady) >= 2:
        (ta, ea), (tb, eb) = steady[0], steady[-1]
        e = {"power_w": (eb - ea) / 1000.0 / (tb - ta), "seconds": tb - ta}
        e.update(sampler.window(ta, tb))
    return {"probe": "step", "command": cmd, "returncode": proc.returncode, "wall_s": t_end - t_start,
            "output_tail": "".join(out_lines[-15:]), **e}


def power_table(data: dict, step_compute_share: float) -> dict:
    """The `[power]` table of a GPU preset (gpus.PowerSpec) from a power.json this module wrote.

    `step_compute_share` is the share of the step's kernel time in compute-bound kernels: read from Phantora's
    trace of the same step command (costed kernels classified by the roofline's bound), not measured here."""
    probes = {p["probe"]: p for p in data["probes"] if "error" not in p}
    base = data["info"]["idle_power_w"]
    # GEMM throughput per MHz, from the runs whose clock held still (no duty cycle)
    per_mhz = [probes[n]["tflops"] / probes[n]["sm_clock_mean_mhz"] for n in GEMM_CLOCK_PROBES if n in probes]
    k = statistics.fmean(per_mhz)
    spin = probes["spin"]
    spin_dyn = spin["power_w"] - base
    xs, ys = [], []
    for p in probes.values():
        if not p["probe"].startswith("duty_"):
            continue
        f = p["gemm_tflops"] / k                  # the GEMM's own clock, from its throughput
        share = p["gemm_share"]
        spin_w = base + spin_dyn * (f / spin["sm_clock_mean_mhz"]) ** 2.5    # the spin at the same clock
        gemm_w = (p["power_w"] - (1.0 - share) * spin_w) / share
        xs.append(math.log(f))
        ys.append(math.log(gemm_w - base))
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    gamma = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    step = probes["step"]
    return {"base_w": round(base, 1), "dynamic_exponent": round(gamma, 2),
            "memory_bound_w": round(statistics.fmean(probes[n]["power_w"] for n in ("copy_2GiB", "add_2GiB")), 1),
            "step_power_w": round(step["power_w"], 1), "step_clock_mhz": round(step["sm_clock_mean_mhz"]),
            "step_compute_share": round(step_compute_share, 2),
            "tensor_clock_mhz": round(max(probes[n]["sm_clock_mean_mhz"] for n in ("gemm8192_zeros", "gemm8192_sign")))}


GEMM_CLOCK_PROBES = ("gemm8192_random", "gemm8192_half", "gemm8192_sign", "gemm8192_zeros")


def step_compute_share(trace: str | Path, gpu: str) -> float:
    """The share of a step's kernel time spent in compute-bound kernels, from Phantora's trace of the step command
    the power probe ran: each kernel classified by the roofline of `gpu` (compute time at peak above memory time),
    its recorded duration summed, over the whole iterations of every simulated rank."""
    from ..costmodel.families import work
    from ..costmodel.roofline import RooflineModel
    from ..costmodel.signature import Signature
    from ..gpus import load_gpu
    from ..trace.reader import TraceReader

    roofline = RooflineModel(load_gpu(gpu))
    spec = roofline.gpu
    compute = total = 0.0
    with TraceReader(trace) as reader:
        keys = reader.signatures
        bound: dict[int, bool] = {}
        for rank in reader.ranks:
            ops = reader.ops(rank)
            marks = reader.iterations(rank, ops)
            if len(marks) < 2:
                raise PhantoraError(f"{trace}: rank {rank} has fewer than two iteration marks: no whole step")
            k = ops[(ops["kind"] == 0) & (ops["start"] >= marks[0]) & (ops["end"] <= marks[-1])]
            for sig, flops, nbytes, d in zip(k["sig"], k["flops"], k["nbytes"], k["end"] - k["start"]):
                sig = int(sig)
                if sig not in bound:
                    if sig >= 0:
                        bound[sig] = roofline.bound(work(Signature.from_key(keys[sig]))) == "compute"
                    else:                                   # no signature: the recorded work, at the bf16 peak
                        bound[sig] = flops / spec.peak_flops("bf16") > nbytes / spec.hbm_bytes_per_s
                total += d
                compute += d if bound[sig] else 0.0
    if total <= 0:
        raise PhantoraError(f"{trace}: no kernel time inside the iterations")
    return float(compute / total)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="directory for power.json (the probes)")
    p.add_argument("--table", metavar="POWER_JSON", help="print the GPU preset's [power] table of a power.json "
                   "instead of probing; needs --trace and --gpu")
    p.add_argument("--trace", help="with --table: Phantora's trace of the probe's --step-cmd, for the step's "
                   "compute-bound share")
    p.add_argument("--gpu", help="with --table: the GPU preset whose roofline classifies the trace's kernels")
    p.add_argument("--seconds", type=float, default=3.0, help="measured seconds per probe (after 1 s settling)")
    p.add_argument("--only", default=None, help="comma-separated probe names")
    p.add_argument("--duty", default=None, metavar="G:US,...",
                   help="GEMM bursts: G random 8192^3 GEMMs then a US-microsecond spin, per pattern")
    p.add_argument("--step-cmd", default=None, help="a training command to sample as a whole")
    p.add_argument("--step-skip-s", type=float, default=20.0, help="seconds of the step command not sampled")
    args = p.parse_args(argv)
    if args.table:
        if not (args.trace and args.gpu):
            p.error("--table needs --trace (the simulated step command) and --gpu")
        from ..groundtruth.tomlwrite import dumps

        data = json.loads(Path(args.table).read_text())
        print(dumps({"power": power_table(data, step_compute_share(args.trace, args.gpu))}), end="")
        return 0
    if not args.out:
        p.error("--out is required to probe")
    import torch

    nvml = NVML(0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "power_limit_w": nvml.limit_w(), "max_sm_clock_mhz": nvml.max_clock_mhz(),
            "max_mem_clock_mhz": nvml.max_clock_mhz(NVML_CLOCK_MEM), "idle_power_w": nvml.power_w(),
            "idle_sm_clock_mhz": nvml.clock_mhz(), "idle_voltage_mv": voltage_mv(),
            "command": " ".join(["python", "-m", "phantora.probes.powerprobe"] + (argv or sys.argv[1:]))}
    print(json.dumps(info), flush=True)
    sampler = Sampler(nvml)
    sampler.start()
    results = []
    only = set(args.only.split(",")) if args.only else None
    for name, setup in probes(torch):
        if only and name not in only:
            continue
        try:
            rec = measure(nvml, sampler, torch, name, setup, args.seconds)
        except Exception as e:      # one probe failing (a backend missing) must not lose the others
            rec = {"probe": name, "error": f"{type(e).__name__}: {e}"}
        results.append(rec)
        print(json.dumps(rec), flush=True)
        torch.cuda.empty_cache()
        time.sleep(1.0)
    for spec in (args.duty.split(",") if args.duty else []):
        gemms, spin_us = spec.split(":")
        rec = measure_duty(nvml, sampler, torch, int(gemms), float(spin_us), args.seconds)
        results.append(rec)
        print(json.dumps(rec), flush=True)
        time.sleep(1.0)
    if args.step_cmd:
        rec = measure_step(nvml, sampler, args.step_cmd, args.step_skip_s)
        results.append(rec)
        print(json.dumps({k: v for k, v in rec.items() if k != "output_tail"}), flush=True)
    sampler.stop()
    (out / "power.json").write_text(json.dumps({"info": info, "probes": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
