"""Files the `moe` suite's records from the SUMMARY lines of the MoE trainer's logs that measure.sh wrote.

    python groundtruth/moe/make_records.py groundtruth/moe/h200x2

Each <name>.log (presets/workloads/moe.py's output, ending with `SUMMARY {...}`) becomes
groundtruth/moe/h200-<gpus>-moe-stack-2048-ep<ep>-<route>.toml, checked as `phantora groundtruth submit` checks a
record. The figures: iteration time = the SUMMARY's `median_step_s` (median of the steps after `--warmup`);
tokens/s per GPU = tokens per GPU per step (`--tokens`) / that median; memory = the SUMMARY's `peak_mem_gib`
(torch.cuda.max_memory_reserved, rank 0's, the largest over the run's steps).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from phantora.groundtruth.checks import check_record
from phantora.groundtruth.schema import Hardware, Metrics, Parallelism, Record, Source, Workload
from phantora.groundtruth.submit import canonical_text

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MODEL = "moe-stack-2048"            # the model preset of the trainer's default shape
SHAPE = {"experts": 8, "top_k": 2, "dim": 2048, "ffn": 2048, "layers": 4}
TRAINER_COMMIT = "1cda16a"          # presets/workloads/moe.py as measured
HOST = "2 NVLinked H200 of one host"
CLUSTERS = {1: "h200-1gpu", 2: "h200-2gpu-nvlink"}


def summary_of(log: Path) -> dict:
    """The JSON of the log's `SUMMARY ` line (the last one)."""
    lines = [x for x in log.read_text().splitlines() if x.startswith("SUMMARY ")]
    if not lines:
        raise SystemExit(f"{log}: no SUMMARY line")
    return json.loads(lines[-1][len("SUMMARY "):])


def route_slug(route: str) -> str:
    return route.replace(":", "").replace(",", "-")


def record_of(log: Path) -> Record:
    d = summary_of(log)
    c = d["config"]
    gpus, ep, route, tokens = d["world_size"], c["ep"], c["route"], c["tokens"]
    if {k: c[k] for k in SHAPE} != SHAPE:
        raise SystemExit(f"{log}: not the shape of {MODEL} ({SHAPE})")
    folder = log.parent.relative_to(ROOT)
    median = d["median_step_s"]
    first, last = c["warmup"] + 1, c["steps"]
    memory_note = ("rank 0's (the trainer logs rank 0 only)" if gpus > 1 else "the GPU's")
    notes = (f"The MoE trainer presets/workloads/moe.py ({c['experts']} experts, top-{c['top_k']}, dim {c['dim']}, "
             f"expert SwiGLU {c['ffn']}, {c['layers']} layers, {tokens} tokens per GPU per step, bf16, AdamW) on "
             f"{gpus} GPU(s) of {HOST}, expert parallelism {ep}, the router forced to route '{route}' "
             f"(--route {route}), {c['steps']} steps. iteration_s is the SUMMARY's median_step_s, the median of "
             f"steps {first}-{last} (--warmup {c['warmup']}); tokens_per_s_per_gpu = {tokens} tokens per GPU / "
             f"that median; memory_gib is the SUMMARY's peak_mem_gib, {memory_note} torch.cuda.max_memory_reserved "
             f"over the run. Raw output: {folder}/{log.name} (the SUMMARY line); command: groundtruth/moe/measure.sh "
             f"(`{'torchrun --nproc-per-node 2 ' if gpus > 1 else 'python3 '}presets/workloads/moe.py --ep {ep} "
             f"--route {route} --steps {c['steps']} --warmup {c['warmup']}`). The simulation runs the trainer's "
             f"top-k router with `phantora run --routing {route}` (validation/moe.py).")
    assumptions = {}
    if gpus > 1:
        assumptions["workload.parallelism"] = (
            f"the trainer shards the experts over the {gpus} GPUs (ep {ep}) and gives each GPU its own {tokens} "
            f"tokens; its router and norms are replicated and their gradients are not reduced. dp_shard {gpus} is "
            f"the data-parallel degree expert parallelism is carved out of (TorchTitan's layout)")
        assumptions["metrics.memory_gib"] = (
            "rank 0's peak: the trainer logs rank 0 only. Rank 0 holds experts 0-3, which receive at least as many "
            "rows as rank 1's under either forced route (equal with balanced, most with Zipf), so it is taken as "
            "the largest over the GPUs")
    return Record(
        id=f"h200-{gpus}-{MODEL}-ep{ep}-{route_slug(route)}", suite="moe", notes=notes,
        assumptions=assumptions,
        source=Source(date="2026-11-26", contributor=f"phantora maintainers (measured on {gpus} GPU(s) of {HOST})",
                      version=f"presets/workloads/moe.py at {TRAINER_COMMIT}",
                      section=f"{folder}/{log.name}: SUMMARY line"),
        hardware=Hardware(gpu="h200-sxm-141gb", gpus=gpus, hosts=1, gpus_per_host=gpus, cluster=CLUSTERS[gpus],
                          intra_host_link="nvswitch", inter_host_gbps_per_gpu=0.0, inter_host_link="none (one host)"),
        workload=Workload(framework="phantora-moe", framework_version=TRAINER_COMMIT, model=MODEL,
                          micro_batch=tokens, global_batch=tokens * gpus, seq_len=1, activation_checkpointing="none",
                          parallelism=Parallelism(dp_shard=gpus, ep=ep), precision="bf16",
                          torch_version="2.11.0+cu130", optimizer="AdamW", options={"route": route}),
        metrics=Metrics(tokens_per_s_per_gpu=round(tokens / median, 1), iteration_s=round(median, 6),
                        memory_gib=d["peak_mem_gib"]),
    )


def main(folder: str) -> None:
    where = Path(folder).resolve()
    if not where.is_relative_to(ROOT):
        raise SystemExit(f"{folder}: copy measure.sh's output under groundtruth/moe/ first (the records cite their "
                         f"raw logs by their path in the repository)")
    logs = sorted(where.glob("moe-*.log"))
    if not logs:
        raise SystemExit(f"{folder}: no moe-*.log (the trainer's output that measure.sh writes)")
    for log in logs:
        rec = record_of(log)
        rec.validate()
        report = check_record(rec)
        if not report.ok:
            raise SystemExit("\n".join(report.problems))
        (HERE / f"{rec.id}.toml").write_text(canonical_text(rec))
        print(HERE / f"{rec.id}.toml")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
