"""Which ranks of a live run get a process (`--ranks all|auto|LIST`) and which simulated rank each other rank mirrors.

- `all`: every rank runs.
- `LIST` (e.g. `0,8` or `0-3,8`): the listed ranks run; it must contain rank 0. Every other rank mirrors the largest
  listed rank not above it, so a list of the first ranks of equal blocks means "one process per block".
- `auto`: one process per class of symmetric ranks. SPMD training scripts are symmetric except across pipeline stages
  (stages hold different layers and exchange activations), and the frameworks Phantora knows lay pipeline stages out
  as the outermost mesh dimension: stage s holds ranks [s·W/P, (s+1)·W/P). So `auto` runs the first rank of each stage.
  The pipeline degree P is `--pp-degree`, or read from the program's own arguments (`--pp N` of the reference
  workload, `--parallelism.pipeline-parallel-degree N` of TorchTitan, with hyphens or underscores); 1 when neither
  says.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..errors import PhantoraError

# TorchTitan's tyro parser takes its flags with hyphens or underscores
_PP_FLAGS = ("--pp", "--parallelism.pipeline-parallel-degree", "--parallelism.pipeline_parallel_degree",
             "--pipeline-parallel-size", "--pipeline-model-parallel-size")


@dataclass(frozen=True)
class RankPlan:
    simulated: list[int]
    rank_map: list[int]
    mode: str                     # "all", "auto" or "list"
    pp_degree: int = 1

    @property
    def mirrored(self) -> int:
        return len(self.rank_map) - len(self.simulated)


def pipeline_degree(argv: list[str]) -> int | None:
    """The pipeline-parallel degree a program's arguments ask for, if they say."""
    for i, a in enumerate(argv):
        for flag in _PP_FLAGS:
            value = None
            if a == flag and i + 1 < len(argv):
                value = argv[i + 1]
            elif a.startswith(flag + "="):
                value = a.split("=", 1)[1]
            if value is not None:
                try:
                    return int(value)
                except ValueError:
                    raise PhantoraError(f"{flag} {value!r} in the program's arguments is not an integer") from None
    return None


def parse_rank_list(text: str, world: int) -> list[int]:
    ranks: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise PhantoraError(f"--ranks: {part!r} is not a rank or a range a-b (examples: all, auto, 0,8, 0-3)")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        if hi < lo:
            raise PhantoraError(f"--ranks: range {part!r} is backwards")
        if hi >= world:
            raise PhantoraError(f"--ranks: rank {hi} is outside the world of {world} GPUs")
        ranks.update(range(lo, hi + 1))
    if 0 not in ranks:
        raise PhantoraError("--ranks: the list must include rank 0 (every rank mirrors a listed rank at or below it)")
    return sorted(ranks)


def plan_ranks(spec_text: str, world: int, argv: list[str], pp_degree: int | None = None) -> RankPlan:
    text = spec_text.strip().lower()
    if text == "all":
        return RankPlan(list(range(world)), list(range(world)), "all")
    if text == "auto":
        p = pp_degree if pp_degree is not None else (pipeline_degree(argv) or 1)
        if p < 1 or world % p:
            raise PhantoraError(f"pipeline degree {p} does not divide the world of {world} GPUs")
        block = world // p
        simulated = [s * block for s in range(p)]
        return RankPlan(simulated, [(r // block) * block for r in range(world)], "auto", p)
    simulated = parse_rank_list(text, world)
    rank_map = []
    j = 0
    for r in range(world):
        while j + 1 < len(simulated) and simulated[j + 1] <= r:
            j += 1
        rank_map.append(simulated[j])
    return RankPlan(simulated, rank_map, "list")


# ---- how many rank processes this machine holds --------------------------------------------------------------------

RANKS_PER_CPU = 4
"""Rank processes per CPU core before a run is called too large: the ranks wait on one another and on the engine much
of the time, so a few per core still advance (8 ranks of an FSDP step on 2 cores run at about a quarter the speed)."""
RANK_MEMORY_BYTES = 512 << 20
"""Memory counted per rank process: a rank of the reference workload peaks at about 0.35 GiB (torch, the stubs, the
program's fake tensors), with room for the program's own data."""
REFUSE_FACTOR = 4
"""A run of more than this many times the machine's capacity is refused unless forced (--force-ranks)."""


def usable_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def available_memory() -> int | None:
    """Bytes of memory available to new processes (MemAvailable), or None when the system does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def process_capacity(cpus: int | None = None, memory: int | None = None) -> tuple[int, str]:
    """How many rank processes this machine holds: RANKS_PER_CPU per usable CPU core and RANK_MEMORY_BYTES of
    available memory each, whichever allows fewer; and a phrase saying why."""
    cpus = usable_cpus() if cpus is None else cpus
    memory = available_memory() if memory is None else memory
    by_cpu = RANKS_PER_CPU * cpus
    why = f"{cpus} CPU core(s) x {RANKS_PER_CPU}"
    if memory is not None:
        by_mem = int(memory // RANK_MEMORY_BYTES)
        if by_mem < by_cpu:
            return max(1, by_mem), f"{memory / 2**30:.1f} GiB available / {RANK_MEMORY_BYTES / 2**30:.1f} GiB per rank"
    return max(1, by_cpu), why


def check_process_count(plan: RankPlan, force: bool = False, cpus: int | None = None,
                        memory: int | None = None) -> str | None:
    """A warning when the plan starts more rank processes than the machine holds (None if it fits); PhantoraError
    when it starts more than REFUSE_FACTOR times that, unless `force`."""
    n = len(plan.simulated)
    capacity, why = process_capacity(cpus, memory)
    if n <= capacity:
        return None
    flag = {"all": "all", "auto": "auto"}.get(plan.mode, "LIST")
    if plan.mode != "auto":
        advice = ("--ranks auto runs one process per pipeline stage and mirrors the others (same figures on a "
                  "symmetric program)")
    else:
        advice = "fewer pipeline stages (--pp-degree) mean fewer processes"
    if n > REFUSE_FACTOR * capacity and not force:
        raise PhantoraError(f"--ranks {flag}: {n} rank processes is far more than this machine holds (about "
                            f"{capacity}: {why}); {advice}; pass --force-ranks to start them anyway")
    return (f"{n} rank processes is more than this machine holds (about {capacity}: {why}): the run may be very "
            f"slow or run out of memory; {advice}")
