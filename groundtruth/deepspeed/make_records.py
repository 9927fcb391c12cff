"""Files the `deepspeed` suite's records from the SUMMARY files that measure.sh wrote.

    python groundtruth/deepspeed/make_records.py groundtruth/deepspeed/h200x2 [DATE]

DATE (default 2026-11-26) is the day the folder's rows were measured.

Each <name>.json of presets/workloads/deepspeed_gpt.py becomes groundtruth/deepspeed/<gpu>-<gpus>-<name>.toml, checked
as `phantora groundtruth submit` checks a record; so do those of the workloads that are not language models
(deepspeed_resnet.py, deepspeed_unet.py, deepspeed_gat.py), as records with `task = "other"` measured by their
iteration time. The GPU is read from the folder's system*.txt (nvidia-smi's name), and so are the host's CPU cores
(`nproc`: the CPU optimizer's threads with OMP_NUM_THREADS unset).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from phantora.groundtruth.allocated import allocated_memory
from phantora.groundtruth.hosts import cores_of, host_of
from phantora.groundtruth.schema import Hardware, Metrics, Parallelism, Record, Source, Workload
from phantora.frameworks.deepspeed import NON_LANGUAGE_MODELS
from phantora.groundtruth.submit import canonical_text

SAME_HOST = "../hostcpu/h200x2-same-host"

# rows measured again on other hosts (repeat_rows.sh, offload_profile.sh, resnet_insitu.sh, unet_host.sh): their
# SUMMARY files, relative to this folder, in the order they are recorded as metrics.iteration_s_repeats
REPEATS = {
    "g1-z1-unet-sd15-b8": ("h200x2-repeat/g1-z1-unet-sd15-b8-r1.json", "h200x2-repeat/g1-z1-unet-sd15-b8-r2.json",
                           "h200-unet/g1-z1-unet-sd15-b8.json", "h200-unet/g1-z1-unet-sd15-b8-r2.json"),
    "dp2-z1-unet-sd15-b8": ("h200x2-repeat/dp2-z1-unet-sd15-b8-r1.json", "h200x2-repeat/dp2-z1-unet-sd15-b8-r2.json"),
    "dp2-z2-llama3.2-1b-s2048-mb2-offload": ("h200x2-repeat/dp2-z2-llama3.2-1b-s2048-mb2-offload.json",),
    "g1-z2-llama3.2-1b-s2048-mb2-offload": ("h200x2-offload-g1/plain.json",),
    "g1-z1-resnet50-b128": ("h200x2-resnet/g1-z1-resnet50-b128.json",),
    "dp2-z1-resnet50-b128": ("h200x2-resnet/dp2-z1-resnet50-b128.json",),
    # host B's unprofiled runs (clocks.sh: nvidia-smi sampling in its own process) and the two runs of
    # groundtruth/hostcpu/same_host.sh on a third host
    "g1-z3-llama3.2-1b-s2048-mb2-ac": ("h200x2-clocks/g1-z3-llama3.2-1b-s2048-mb2-ac.json",
                                       f"{SAME_HOST}/run1/rows/g1-z3-llama3.2-1b-s2048-mb2-ac.json",
                                       f"{SAME_HOST}/run2/rows/g1-z3-llama3.2-1b-s2048-mb2-ac.json"),
    "dp2-z3-llama3.2-1b-s2048-mb2": ("h200x2-clocks/dp2-z3-llama3.2-1b-s2048-mb2.json",
                                     f"{SAME_HOST}/run1/rows/dp2-z3-llama3.2-1b-s2048-mb2.json",
                                     f"{SAME_HOST}/run2/rows/dp2-z3-llama3.2-1b-s2048-mb2.json",
                                     "h200x2-zeropp/run1/dp2-z3-llama3.2-1b-s2048-mb2-base.json",
                                     "h200x2-zeropp/base/dp2-z3-llama3.2-1b-s2048-mb2-base.json"),
    "dp2-z3-llama3.2-3b-s2048-mb2-ac": (f"{SAME_HOST}/run1/rows/dp2-z3-llama3.2-3b-s2048-mb2-ac.json",
                                        f"{SAME_HOST}/run2/rows/dp2-z3-llama3.2-3b-s2048-mb2-ac.json",
                                        "h200x2-zeropp/base/dp2-z3-llama3.2-3b-s2048-mb2-ac-base.json"),
    "pp2-z1-llama3.2-3b-s2048-mb1-ga8": ("h200x2-clocks/pp2-z1-llama3.2-3b-s2048-mb1-ga8.json",),
    "pp2-z1-llama3.2-1b-s2048-mb2-ga8-ac": ("h200x2-clocks/pp2-z1-llama3.2-1b-s2048-mb2-ga8-ac.json",),
    "dp2-z2-llama3.2-3b-s4096-mb1-ac": ("h200x2-clocks/dp2-z2-llama3.2-3b-s4096-mb1-ac.json",),
    # ZeRO++ (PART 6): the first run on the same host (the files that came back from it); the plain ZeRO-3 rows of
    # PART 1 run again beside them, twice
    "dp2-z3-llama3-8b-l8-s4096-mb1-ac-qwz-qgz": ("h200x2-zeropp/run1/dp2-z3-llama3-8b-l8-s4096-mb1-ac-qwz-qgz.json",),
    "dp2-z3-llama3.2-1b-s2048-mb2-qwz-qgz": ("h200x2-zeropp/run1/dp2-z3-llama3.2-1b-s2048-mb2-qwz-qgz.json",),
    "dp2-z3-llama3-8b-l8-s4096-mb1-ac": ("h200x2-zeropp/run1/dp2-z3-llama3-8b-l8-s4096-mb1-ac-base.json",
                                         "h200x2-zeropp/base/dp2-z3-llama3-8b-l8-s4096-mb1-ac-base.json"),
    # ZeRO-Infinity: a second host, its storage measured through DeepSpeed's handle beside the run
    "g1-z3-llama3.2-1b-l2-s2048-mb2-nvme": ("h200-nvme/run2/g1-z3-llama3.2-1b-l2-s2048-mb2-nvme-r2.json",),
}


def _repeats(name: str) -> tuple[str, dict]:
    """The notes' sentence citing a row's repeated runs and the metrics they give ("", {} without any)."""
    files = REPEATS.get(name)
    if not files:
        return "", {}
    here = Path(__file__).resolve().parent
    root = here.parent.parent
    values = [round(json.loads((here / f).read_text())["median_step_s"], 5) for f in files]
    where = ", ".join(str((here / f).resolve().relative_to(root)) for f in files)
    return (f" Repeated runs of the same configuration on other hosts (metrics.iteration_s_repeats, in order; the "
            f"workload's SUMMARY median_step_s): {where}."), {"iteration_s_repeats": values}


def _preset_layers(model: str) -> int:
    import tomllib

    from phantora.paths import presets_dir
    return tomllib.loads((presets_dir() / "models" / f"{model}.toml").read_text())["n_layers"]


def record_of(path: Path, date: str) -> Record:
    d = json.loads(path.read_text())
    c = d["config"]
    gpus = c["world_size"]
    pp = c.get("pp", 1)
    dp = gpus // pp
    name = path.stem
    options = {"zero": c["zero"]}
    if c["offload_optimizer"] != "none":
        options["offload_optimizer"] = c["offload_optimizer"]
    if c.get("offload_param", "none") != "none":
        options["offload_param"] = c["offload_param"]
    if c["torch_adam"]:
        options["torch_adam"] = True
    for key in ("quantized_weights", "quantized_gradients"):     # ZeRO++
        if c.get(key):
            options[key] = True
    if c.get("hpz", 1) != 1:
        options["hpz"] = c["hpz"]
    if d["shapes"]["n_layers"] != _preset_layers(d["model"]):
        options["layers"] = d["shapes"]["n_layers"]
    folder = path.parent.relative_to(Path(__file__).resolve().parent.parent.parent)
    measured = host_of(path.parent)
    prefix, gpu, host = measured.prefix, measured.gpu, measured.words
    threads = "OMP_NUM_THREADS=1 per process (torchrun's default for 2 processes)" if gpus > 1 else \
        "OMP_NUM_THREADS unset (all host cores)"
    offload = f" The CPU optimizer ran with {threads}." if c["offload_optimizer"] != "none" else ""
    if "nvme" in (c["offload_optimizer"], c.get("offload_param")):
        offload += (" ZeRO-Infinity: swap files in a folder of the host's storage (groundtruth/deepspeed/README.md, "
                    "\"ZeRO-Infinity on one H200\").")
    zeropp = [words for key, words in (("quantized_weights", "int8 weight all-gathers (qwZ)"),
                                       ("quantized_gradients", "4-bit gradient all-to-alls (qgZ)")) if c.get(key)]
    if c.get("hpz", 1) != 1:
        zeropp.append(f"a secondary weight partition over {c['hpz']} GPUs (hpZ)")
    if zeropp:
        offload += (f" ZeRO++: {' and '.join(zeropp)}, DeepSpeed's quantizer extension JIT-compiled on the host "
                    f"(groundtruth/deepspeed/README.md, \"ZeRO++ on two H200\").")
    memory, allocated, assumed = allocated_memory(d["peak_mem_gib"], pp)
    again, repeats = _repeats(name)
    return Record(
        id=f"{prefix}-{gpus}-{name}", suite="deepspeed",
        notes=(f"presets/workloads/deepspeed_gpt.py (DeepSpeed 0.19.8, {c['optimizer']}, ZeRO {c['zero']}"
               f"{', PipelineEngine over %d stages' % pp if pp > 1 else ''}) on {gpus} "
               f"GPU(s) of {host}, {c['steps']} steps, median of steps 2-{c['steps']} (the workload's SUMMARY).{offload}"
               f" {memory} Raw output: {folder}/{name}.log and .json; command: groundtruth/deepspeed/measure.sh."
               f"{again}"),
        source=Source(date=date, contributor=f"phantora maintainers (measured on {gpus} GPU(s) of {host})",
                      version="presets/workloads/deepspeed_gpt.py, deepspeed 0.19.8",
                      section=f"{folder}/{name}.json"),
        hardware=Hardware(gpu=gpu, gpus=gpus, hosts=1, gpus_per_host=gpus,
                          cluster=measured.cluster(gpus), intra_host_link="nvswitch",
                          inter_host_gbps_per_gpu=0.0, inter_host_link="none (one host)",
                          host_cpu_cores=cores_of(path.parent)),
        workload=Workload(framework="deepspeed", framework_version="0.19.8", model=d["model"],
                          micro_batch=c["micro_batch"], global_batch=c["micro_batch"] * c["grad_accum"] * dp,
                          seq_len=c["seq"], activation_checkpointing=c["ac"],
                          parallelism=Parallelism(dp_shard=dp if c["zero"] == 3 else 1,
                                                  dp_replicate=1 if c["zero"] == 3 else dp, pp=pp),
                          precision=c["precision"], torch_version="2.11.0+cu130",
                          optimizer=f"AdamW ({c['optimizer']}, fp32 master)", options=options),
        metrics=Metrics(iteration_s=round(d["median_step_s"], 5), tokens_per_s_per_gpu=round(d["tps_per_gpu"], 1),
                        **allocated, **repeats),
        assumptions=assumed,
    )


OTHER_WORKLOADS = {"deepspeed_resnet": "ResNet-50 (224 x 224 images)", "deepspeed_unet":
                   "Stable Diffusion 1.5's UNet (diffusers, 64 x 64 latents)", "deepspeed_gat":
                   "a 3-layer GAT (torch_geometric GATConv, 8 heads x 64) on one full graph of ogbn-arxiv's sizes"}


def other_record_of(path: Path, date: str) -> Record:
    """The record of a workload that is not a language model: samples per step, its iteration time."""
    d = json.loads(path.read_text())
    c = d["config"]
    gpus = c["world_size"]
    name = path.stem
    micro = c.get("micro_batch", 1)
    options: dict = {"zero": c["zero"]}
    # the workload's shapes, which its rerun passes (the script's defaults may change)
    for key in NON_LANGUAGE_MODELS[d["model"]][2]:
        options[key] = c[key]
    if c.get("offload_optimizer", "none") != "none":
        options["offload_optimizer"] = c["offload_optimizer"]
    if c.get("torch_adam"):
        options["torch_adam"] = True
    folder = path.parent.relative_to(Path(__file__).resolve().parent.parent.parent)
    measured = host_of(path.parent)
    spread = f"{min(d['step_times_s'][1:]) * 1e3:.1f}-{max(d['step_times_s'][1:]) * 1e3:.1f} ms"
    memory, allocated, assumed = allocated_memory(d["peak_mem_gib"], 1)
    again, repeats = _repeats(name)
    return Record(
        id=f"{measured.prefix}-{gpus}-{name}", suite="deepspeed",
        notes=(f"presets/workloads/{d['workload']}.py: {OTHER_WORKLOADS[d['workload']]} (DeepSpeed 0.19.8, "
               f"FusedAdam, ZeRO {c['zero']}) on {gpus} GPU(s) of {measured.words}, {c['steps']} steps, median of "
               f"steps 2-{c['steps']} (the workload's SUMMARY; those steps took {spread}). Not a language model: "
               f"samples per step, no tokens or model FLOPs. {memory} Raw output: {folder}/{name}.log and .json; "
               f"command: groundtruth/deepspeed/measure.sh.{again}"),
        source=Source(date=date, contributor=f"phantora maintainers (measured on {gpus} GPU(s) of {measured.words})",
                      version=f"presets/workloads/{d['workload']}.py, deepspeed 0.19.8",
                      section=f"{folder}/{name}.json"),
        hardware=Hardware(gpu=measured.gpu, gpus=gpus, hosts=1, gpus_per_host=gpus,
                          cluster=measured.cluster(gpus), intra_host_link="nvswitch",
                          inter_host_gbps_per_gpu=0.0, inter_host_link="none (one host)",
                          host_cpu_cores=cores_of(path.parent)),
        workload=Workload(framework="deepspeed", framework_version="0.19.8", model=d["model"], micro_batch=micro,
                          global_batch=micro * c.get("grad_accum", 1) * gpus, seq_len=1,
                          activation_checkpointing="none", parallelism=Parallelism(dp_replicate=gpus),
                          precision=c["precision"], torch_version="2.11.0+cu130",
                          optimizer="AdamW (FusedAdam, fp32 master)", options=options, task="other"),
        metrics=Metrics(iteration_s=round(d["median_step_s"], 5), **allocated, **repeats),
        assumptions=assumed,
    )


def main(folder: str, date: str = "2026-11-26") -> None:
    out = Path(__file__).resolve().parent
    for path in sorted(Path(folder).resolve().glob("*.json")):
        workload = json.loads(path.read_text()).get("workload")
        if workload == "deepspeed_gpt":
            rec = record_of(path, date)
        elif workload in OTHER_WORKLOADS:
            rec = other_record_of(path, date)
        else:
            continue
        rec.validate()
        (out / f"{rec.id}.toml").write_text(canonical_text(rec))
        print(out / f"{rec.id}.toml")


if __name__ == "__main__":
    main(*sys.argv[1:3])
