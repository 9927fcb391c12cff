"""Files the `megatron` suite's records from the workload's SUMMARY files that measure.sh wrote.

    python groundtruth/megatron/make_records.py groundtruth/megatron/h200x2
    python groundtruth/megatron/make_records.py groundtruth/megatron/h100x1

Each <name>.json becomes groundtruth/megatron/<gpu>-<gpus>-<name>.toml, checked as `phantora groundtruth submit`
checks a record. The GPU is read from the folder's system*.txt (nvidia-smi's name).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from phantora.groundtruth.allocated import allocated_memory
from phantora.groundtruth.hosts import host_of
from phantora.groundtruth.schema import Hardware, Metrics, Parallelism, Record, Source, Workload
from phantora.groundtruth.submit import canonical_text

RECOMPUTE = {"none": "none", "full": "full", "selective": "selective-op"}
OPTION_KEYS = ("vpp", "distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather", "sequence_parallel")


SCRIPTS = {"h200": "measure.sh", "h100": "measure-1gpu.sh"}     # the measuring script of each host's rows


def record_of(path: Path) -> Record:
    d = json.loads(path.read_text())
    c = d["config"]
    gpus = c["world_size"]
    name = path.stem
    options = {k: c[k] for k in OPTION_KEYS if c.get(k) not in (None, False)}
    if d["shapes"]["n_layers"] != _preset_layers(d["model"]):
        options["layers"] = d["shapes"]["n_layers"]
    folder = path.parent.relative_to(Path(__file__).resolve().parent.parent.parent)
    measured = host_of(path.parent)
    prefix, gpu, host, script = measured.prefix, measured.gpu, measured.words, SCRIPTS[measured.prefix]
    memory, allocated, assumed = allocated_memory(d["peak_mem_gib"], c["pp"])
    log = (f"Raw output: {folder}/{name}.log and .json" if path.with_suffix(".log").exists() else
           f"Raw output: {folder}/{name}.json (the run's log was not kept)")
    return Record(
        id=f"{prefix}-{gpus}-{name}", suite="megatron",
        notes=(f"presets/workloads/megatron_gpt.py (Megatron-core 0.16.1, local layer spec) on {gpus} GPU(s) of "
               f"{host}, {c['steps']} steps, median of steps 2-{c['steps']} (the workload's SUMMARY). {memory} "
               f"{log}; "
               f"command: groundtruth/megatron/{script}."),
        source=Source(date="2026-11-26", contributor=f"phantora maintainers (measured on {gpus} GPU(s) of {host})", version="presets/workloads/megatron_gpt.py, megatron-core 0.16.1",
                      section=f"{folder}/{name}.json"),
        hardware=Hardware(gpu=gpu, gpus=gpus, hosts=1, gpus_per_host=gpus,
                          cluster=measured.cluster(gpus), intra_host_link="nvswitch",
                          inter_host_gbps_per_gpu=0.0, inter_host_link="none (one host)"),
        workload=Workload(framework="megatron-core", framework_version="0.16.1", model=d["model"],
                          micro_batch=c["micro_batch"], global_batch=c["global_batch"], seq_len=c["seq"],
                          activation_checkpointing=RECOMPUTE[c["recompute"]],
                          parallelism=Parallelism(dp_replicate=c["dp"], tp=c["tp"], pp=c["pp"]),
                          precision="bf16", torch_version="2.11.0+cu130", optimizer="Adam (Megatron, fp32 master)",
                          options=options),
        metrics=Metrics(iteration_s=round(d["median_step_s"], 5), tokens_per_s_per_gpu=round(d["tps_per_gpu"], 1),
                        **allocated),
        assumptions=assumed,
    )


def _preset_layers(model: str) -> int:
    import tomllib

    from phantora.paths import presets_dir
    return tomllib.loads((presets_dir() / "models" / f"{model}.toml").read_text())["n_layers"]


def main(folder: str) -> None:
    out = Path(__file__).resolve().parent
    for path in sorted(Path(folder).resolve().glob("*.json")):
        rec = record_of(path)
        rec.validate()
        (out / f"{rec.id}.toml").write_text(canonical_text(rec))
        print(out / f"{rec.id}.toml")


if __name__ == "__main__":
    main(sys.argv[1])
