"""The command that reproduces a record of the project's MoE trainer (framework "phantora-moe":
presets/workloads/moe.py, the trainer the `moe` suite was measured with), and the `phantora run` options of its
expert routing.

A record maps to the trainer as follows:
- `workload.model`: a `moe-stack` model preset (presets/models/moe-stack-2048.toml: blocks of x + MoE(RMSNorm(x))
  only) gives `--experts`, `--top-k`, `--dim`, `--ffn` and `--layers`;
- `micro_batch × seq_len` gives `--tokens`, the tokens each GPU routes per step (a moe-stack sequence is one token);
- `parallelism.ep` gives `--ep`: 1 on one GPU, or every GPU of the job (the trainer reduces no gradients, so expert
  parallelism over all GPUs is its only multi-GPU layout);
- `options.route` is how the measured router routed: `balanced` or `zipf:S` (or `loads:L0,...`), the trainer's
  forced `--route`, which makes a real GPU route with the per-expert counts of `phantora.routing`. The simulated
  router has no score values to route by, so the case runs the trainer's own top-k router (`--route topk`: a forced
  route builds its expert ids with `repeat_interleave`, whose output shape depends on values a simulation does not
  have) and `phantora run --routing ROUTE` gives every layer those same per-expert counts (docs/stubs.md, "Expert
  routing");
- 12 steps, the first 4 warm-up (`--steps 12 --warmup 4`), as groundtruth/moe/measure.sh measured them. The
  measurement is the median of steps 5-12; the simulation's iteration time is the median of steps 2-12 (gaps
  between optimizer steps), which are all the same steady step.
"""

from __future__ import annotations

from phantora.errors import PhantoraError
from phantora.groundtruth.schema import Record
from phantora.paths import presets_dir

from .torchtitan import UnsupportedCase

FRAMEWORK = "phantora-moe"
STEPS = 12            # as groundtruth/moe/measure.sh
WARMUP = 4
OPTION_KEYS = ("route",)
SIMULATED_ROUTE = "topk"    # the trainer's route under simulation; `phantora run --routing` sets the counts


def moe_route(record: Record) -> str:
    """The record's forced routing (`options.route`), checked: what `phantora run --routing` takes."""
    from phantora.routing import parse

    route = record.workload.options.get("route")
    if route is None:
        raise UnsupportedCase("a phantora-moe record names its routing in options.route (balanced, zipf:S or "
                              "loads:L0,L1,...): the trainer's default top-k routing follows score values that a "
                              "simulation does not have")
    if not isinstance(route, str):
        raise UnsupportedCase(f"options.route must be a string such as 'zipf:1.2', got {route!r}")
    kind = route.strip().partition(":")[0].lower()
    if kind == "topk":
        raise UnsupportedCase("options.route 'topk' routes by the router's score values, which a simulation does "
                              "not have: only a forced route (balanced, zipf:S, loads:L0,L1,...) can be reproduced")
    if kind == "file":
        raise UnsupportedCase("options.route 'file:PATH' names a file of the measuring host: give the loads in the "
                              "record (loads:L0,L1,...)")
    try:
        parse(route)
    except PhantoraError as exc:
        raise UnsupportedCase(f"options.route: {exc}") from None
    return route.strip()


def moe_command(record: Record, *, python: str = "python", steps: int = STEPS, warmup: int = WARMUP) -> list[str]:
    """`python presets/workloads/moe.py ...` reproducing the record under `phantora run` (with `moe_run_options`)."""
    from phantora.models import load_model

    wl, hw = record.workload, record.hardware
    p = wl.parallelism
    unknown = sorted(set(wl.options) - set(OPTION_KEYS))
    if unknown:
        raise UnsupportedCase(f"the MoE trainer has no option '{unknown[0]}' (options it takes: "
                              f"{', '.join(OPTION_KEYS)})")
    moe_route(record)                  # a route the simulation can reproduce, else UnsupportedCase
    if p.tp > 1 or p.pp > 1 or p.cp > 1:
        raise UnsupportedCase("the MoE trainer has no tensor, pipeline or context parallelism")
    if p.ep != hw.gpus:
        raise UnsupportedCase(f"the MoE trainer reduces no gradients: on {hw.gpus} GPUs its only layout is expert "
                              f"parallelism over all of them (ep = {hw.gpus}), not ep = {p.ep}")
    if wl.grad_accumulation != 1:
        raise UnsupportedCase("the MoE trainer has no gradient accumulation (global_batch must be micro_batch × "
                              "GPUs)")
    if wl.activation_checkpointing != "none" or wl.compile or wl.float8 or wl.precision != "bf16":
        raise UnsupportedCase("the MoE trainer runs in bf16 (on a GPU) without checkpointing, torch.compile or FP8")
    try:
        model = load_model(wl.model)
    except PhantoraError as exc:
        raise UnsupportedCase(str(exc)) from None
    if not model.is_moe_stack:
        raise UnsupportedCase(f"the MoE trainer's model is a stack of MoE layers without attention (a 'moe-stack' "
                              f"preset such as moe-stack-2048), not the {model.family} model {wl.model}")
    if model.num_experts % p.ep:
        raise UnsupportedCase(f"{model.num_experts} experts cannot be split over ep = {p.ep} GPUs")
    return [python, str(presets_dir() / "workloads" / "moe.py"), "--experts", str(model.num_experts),
            "--top-k", str(model.experts_per_token), "--dim", str(model.dim), "--ffn", str(model.moe_ffn_dim),
            "--layers", str(model.n_layers), "--tokens", str(wl.micro_batch * wl.seq_len), "--ep", str(p.ep),
            "--route", SIMULATED_ROUTE, "--steps", str(steps), "--warmup", str(warmup)]


def moe_run_options(record: Record) -> list[str]:
    """`--routing ROUTE`: the per-expert counts the measured router was forced to. Empty when the record's route
    cannot be reproduced (its case is unsupported: `moe_command` says why)."""
    try:
        return ["--routing", moe_route(record)]
    except UnsupportedCase:
        return []
