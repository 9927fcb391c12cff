"""Single-GPU steps simulated against the same steps measured on real GPUs (groundtruth/insitu/): the reference
workload, Llama 3 8B cut to 8 layers, one process, on an H100 and on an H200. Kernel costs come from the GPUs' own
profiles; a simulated step must land within 3% of the median measured step. The real steps kept their GPU busy
(99% of the step on the H100), so the simulated host's CPU time is left out (`host.cpu_time_scale=0`): it is this
machine's, not the real host's."""

from __future__ import annotations

import json
import re

import pytest

from phantora.paths import groundtruth_dir
from groundtruth_scripts import load_script
from test_live_run import DETERMINISTIC, phantora_run

RUNS = [("h100-sxm-80gb", "h100-hgx", "s4096-b2-none"), ("h100-sxm-80gb", "h100-hgx", "s8192-b1-sel"),
        ("h200-sxm-141gb", "h200-2gpu-nvlink", "s4096-b2-none"), ("h200-sxm-141gb", "h200-2gpu-nvlink", "s8192-b1-sel")]


def _workload_args(real: dict) -> list[str]:
    c = real["config"]
    return ["--model", real["model"], "--layers", str(real["shapes"]["n_layers"]), "--seq", str(c["seq"]),
            "--batch", str(c["batch"]), "--ac", c["ac"]]


@pytest.mark.parametrize("gpu,cluster,name", RUNS, ids=[f"{g}-{n}" for g, _, n in RUNS])
def test_single_gpu_step_matches_the_measured_step(gpu, cluster, name):
    real = json.loads((groundtruth_dir() / "insitu" / gpu / f"real-{name}.json").read_text())
    assert real["config"]["world_size"] == 1 and gpu.split("-")[0].upper() in real["device_name"].upper()
    done = phantora_run("--cluster", cluster, "--nodes", "1", "--gpus-per-node", "1", *DETERMINISTIC, "--no-trace", "--",
                        "python", "presets/workloads/llama.py", *_workload_args(real), "--steps", "4", timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    m = re.search(r"iteration time\s+median ([0-9.]+) ms", done.stdout)
    assert m, done.stdout[-2000:]
    simulated = float(m.group(1)) / 1e3
    assert simulated == pytest.approx(real["median_step_s"], rel=0.03)


def _compare_module():
    return load_script("insitu/compare_kernels.py")


def _timeline(path, kernels):
    """timeline.json as llama.py --kernel-profile writes it, from (name, stream, start_us, duration_us) rows."""
    names = sorted({k[0] for k in kernels})
    rows = [[names.index(n), s, t, d] for n, s, t, d in kernels]
    path.write_text(json.dumps({"names": names, "columns": ["name", "stream", "start_us", "duration_us"],
                                "kernels": rows}))
    return str(path)


def _step(gemm_scale=1.0, add_scale=1.0, nccl_scale=1.0, with_nccl=False):
    """Two GEMM shapes and one element-wise kernel, 16 launches each; NCCL beside every other GEMM if asked."""
    rows, t = [], 0.0
    for i in range(16):
        for name, d in (("nvjet_sm90_gemm", 1000.0 * gemm_scale), ("nvjet_sm90_gemm", 300.0 * gemm_scale),
                        ("vectorized_elementwise_kernel", 50.0 * add_scale)):
            beside = with_nccl and i % 2 == 0 and name.startswith("nvjet")
            d = d * nccl_scale if beside else d
            rows.append((name, 7, t, d))
            if beside:
                rows.append(("ncclDevKernel_AllGather", 20, t, d))
            t += d
    return rows


def _ratios(mod, base, other, outside, capsys):
    mod.main(base, other, outside)
    lines = capsys.readouterr().out.splitlines()
    return {line.split(":")[0].lstrip("# "): float(line.split(":")[1]) for line in lines if line.startswith("#")}


def test_kernel_comparison_recovers_known_slowdowns(tmp_path, capsys):
    """compare_kernels.py (the figures of groundtruth/insitu/README.md): a timeline against itself gives 1; GEMMs
    made 10% slower and element-wise kernels left alone give 1.1 and 1; GEMMs slowed a further 30% beside NCCL
    count only without --outside-nccl."""
    mod = _compare_module()
    base = _timeline(tmp_path / "base.json", _step())
    same = _ratios(mod, base, base, False, capsys)
    assert same == {"GEMMs and attention": 1.0, "other kernels (HBM-bound)": 1.0}
    other = _timeline(tmp_path / "other.json", _step(gemm_scale=1.1, nccl_scale=1.3, with_nccl=True))
    outside = _ratios(mod, base, other, True, capsys)
    assert outside["GEMMs and attention"] == pytest.approx(1.1, abs=1e-3)
    assert outside["other kernels (HBM-bound)"] == pytest.approx(1.0, abs=1e-3)
    everything = _ratios(mod, base, other, False, capsys)
    # the launches beside NCCL make the GEMMs' durations differ from the base's (another cluster, or a higher mean)
    assert everything.get("GEMMs and attention") != pytest.approx(1.1, abs=1e-3)


def _with_annotations(rows, optimizer_us):
    """The rows plus the GPU-side ranges torch.profiler lists beside the kernels: an optimizer step's range after
    each round of kernels (on the compute stream) and an FSDP all-gather range on a side stream over everything."""
    end = max(t + d for _n, _s, t, d in rows)
    out = list(rows) + [("FSDP::all_gather (layers.0)", 18, 0.0, end)]
    out += [("Optimizer.step#AdamW.step", 7, end + i * 1e4, optimizer_us) for i in range(16)]
    return out


def test_kernel_comparison_leaves_out_record_function_ranges(tmp_path, capsys):
    """The ranges of record_function scopes in a timeline (an optimizer step twice as long in one run as in the
    other, an FSDP range on another stream covering every kernel) are not kernels: the ratios stay those of the
    kernels, also for the launches alone on the GPU."""
    mod = _compare_module()
    base = _timeline(tmp_path / "base.json", _with_annotations(_step(), 800.0))
    other = _timeline(tmp_path / "other.json", _with_annotations(_step(gemm_scale=1.1), 400.0))
    ratios = _ratios(mod, base, other, False, capsys)
    assert ratios["GEMMs and attention"] == pytest.approx(1.1, abs=1e-3)
    assert ratios["other kernels (HBM-bound)"] == pytest.approx(1.0, abs=1e-3)
    mod.main(base, other, False, True)
    alone = {line.split(":")[0].lstrip("# "): float(line.split(":")[1])
             for line in capsys.readouterr().out.splitlines() if line.startswith("#")}
    assert alone == {"GEMMs and attention": pytest.approx(1.1, abs=1e-3),
                     "other kernels (HBM-bound)": pytest.approx(1.0, abs=1e-3)}
