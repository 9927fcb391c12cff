"""Whether the pipeline stages a program builds are those `--ranks auto` assumed.

`--ranks auto` runs the first rank of each pipeline stage and lets every other rank mirror the simulated rank of its
block: stage s is taken to hold ranks [s·W/P, (s+1)·W/P) (phantora/live/ranks.py). A program whose stages are laid out
otherwise (Megatron-core's `initialize_model_parallel(order="tp-pp-dp")`, Megatron-LM's `--use-tp-pp-dp-mapping`)
or that runs another number of stages than P would be simulated with some stages never run and their messages
answered by mirrors: a wrong step that looks right. So when the program tells its stage the rank checks it against the
plan and stops with a message otherwise: torch.distributed.pipelining's stages here, Megatron-core's parallel state
and DeepSpeed's PipelineModule (whose stage count a script may set in code, where no argument says it) in their
stand-in rooms (standins/megatron.py, standins/deepspeed.py). The launcher passes the plan as `PHANTORA_RANKS_PLAN`: `auto:P`, or `all` / `list` (not checked: every
rank of `all` runs, and a list is the user's own).
"""

from __future__ import annotations

import functools
import os
from typing import Any

from .errors import UnsupportedOpError

ENV = "PHANTORA_RANKS_PLAN"


def assumed_degree() -> int | None:
    """P of an `auto` plan; None for any other plan."""
    text = os.environ.get(ENV, "")
    if not text.startswith("auto:"):
        return None
    try:
        return int(text.split(":", 1)[1])
    except ValueError:
        return None


def check(stage: int, stages: int, where: str) -> None:
    """This rank is stage `stage` of `stages` by `where`: stop if `--ranks auto` assumed otherwise."""
    p = assumed_degree()
    if p is None:
        return
    rank, world = int(os.environ.get("PHANTORA_RANK", "0")), int(os.environ.get("PHANTORA_WORLD_SIZE", "1"))
    if stages != p:
        raise UnsupportedOpError(
            f"{where}: the program runs {stages} pipeline stage(s), and `--ranks auto` took {p} (from --pp-degree or "
            f"the program's arguments), so some stages would never run: pass --pp-degree {stages} or --ranks all")
    expected = rank // (world // p)
    if stage != expected:
        raise UnsupportedOpError(
            f"{where}: rank {rank} is stage {stage} of the program's pipeline, and `--ranks auto` ran it for stage "
            f"{expected}: it assumes stage s holds ranks [s*W/P, (s+1)*W/P) (the pipeline dimension outermost, as "
            f"Megatron-core's default order, TorchTitan and DeepSpeed lay it out), and this program lays its stages "
            f"out otherwise; stages would be left out and their messages answered by mirrors. Run with --ranks all")


def check_after_init(cls: Any, where: str, stage_of: Any) -> None:
    """Wrap `cls.__init__`: once built, an object tells its (stage, stages) by `stage_of(obj)` (None: not known)."""
    init = getattr(cls, "__init__", None) if cls is not None else None
    if init is None or getattr(init, "__phantora__", False):
        return

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        stage, stages = stage_of(self)
        if isinstance(stage, int) and isinstance(stages, int):
            check(stage, stages, where)

    __init__.__phantora__ = True   # type: ignore[attr-defined]
    cls.__init__ = __init__


def patch_torch_pipelining(stage_module: Any) -> None:
    """A stage of torch.distributed.pipelining is built with its process group: the rank's place in it is its
    stage (for looped schedules, of several stage indices)."""
    check_after_init(getattr(stage_module, "_PipelineStageBase", None), "torch.distributed.pipelining stage",
                      lambda st: (getattr(st, "group_rank", None), getattr(st, "group_size", None)))
