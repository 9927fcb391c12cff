"""`phantora net bench`: the nccl-tests table, computed by the network model.

Columns as nccl-tests prints them (doc/PERFORMANCE.md of NVIDIA/nccl-tests): size (B), count (elements), type, redop,
root, time (us), algbw (GB/s) = size / time, busbw (GB/s) = algbw x the collective's bus factor; plus the algorithm and
protocol the NCCL model picked.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass

from ..cluster import ClusterSpec
from ..errors import PhantoraError
from .collectives import busbw_factor
from .network import Network

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "send_recv")
REDOP = {"all_reduce": "sum", "reduce_scatter": "sum", "reduce": "sum"}


@dataclass
class Row:
    op: str
    size: int
    count: int
    type: str
    redop: str
    root: int
    time_us: float
    algbw: float
    busbw: float
    algo: str
    proto: str


def sizes(min_bytes: int = 8, max_bytes: int = 8 * 2**30, factor: int = 2) -> list[int]:
    """min_bytes, min_bytes x factor, ... up to max_bytes (nccl-tests' -b, -e, -f); refuses ranges that would
    loop forever or give no row."""
    if min_bytes < 1:
        raise PhantoraError(f"the smallest size must be at least 1 byte, got {min_bytes}")
    if factor < 2:
        raise PhantoraError(f"the step factor must be a whole number >= 2, got {factor}")
    if max_bytes < min_bytes:
        raise PhantoraError(f"the largest size ({max_bytes} B) is below the smallest ({min_bytes} B): no row")
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= factor
    return out


def skewed_transfers(ranks: tuple[int, ...], size: int, hot: int) -> list[tuple[int, int, int]]:
    """An all-to-all with uneven split sizes of a `size`-byte send buffer per rank, as an expert-parallel dispatch
    with one busy expert rank: every rank sends the first rank `hot` units and every other rank one unit
    (groundtruth/nccl/measure_collectives.py's all_to_all_skew<hot>)."""
    unit = size // (hot + len(ranks) - 1)
    return [(s, d, unit * (hot if j == 0 else 1)) for s in ranks for j, d in enumerate(ranks)]


def bench(spec: ClusterSpec, op: str, size_list: list[int], ranks: tuple[int, ...] | None = None,
          network: Network | None = None, progress=None, skew: int | None = None) -> list[Row]:
    """The table's rows; with `skew` (all_to_all only) the all-to-all of `skewed_transfers`, run as NCCL runs one
    with split sizes: a group of sends and receives (algorithm "p2p")."""
    net = network or Network(spec)
    ranks = ranks or tuple(range(spec.world_size))
    if skew is not None:
        if op != "all_to_all":
            raise PhantoraError(f"--skew applies to all_to_all only, not {op}")
        if skew < 1:
            raise PhantoraError(f"--skew must be a whole number >= 1, got {skew}")
        rows = []
        for i, size in enumerate(size_list):
            t = net.group_time(skewed_transfers(ranks, size, skew))
            algbw = size / t / 1e9 if t > 0 else 0.0
            rows.append(Row(op, size, size // 4, "float", "none", -1, t * 1e6, algbw,
                            algbw * busbw_factor(op, len(ranks)), "p2p", "Simple"))
            if progress:
                progress(i + 1, len(size_list))
        return rows
    if op == "send_recv":
        # nccl-tests' sendrecv: every rank sends to the next; here the first to the last rank (furthest apart)
        ranks = (ranks[0], ranks[-1])
    n = len(ranks)
    rows = []
    for i, size in enumerate(size_list):
        input_bytes = size // n if op == "all_gather" else size
        t, plan = net.time_alone(op, ranks, input_bytes, 0)
        algbw = size / t / 1e9 if t > 0 else 0.0
        rows.append(Row(op, size, size // 4, "float", REDOP.get(op, "none"), 0 if op in ("broadcast", "reduce") else -1,
                        t * 1e6, algbw, algbw * busbw_factor(op, n), plan.algo, plan.proto))
        if progress:
            progress(i + 1, len(size_list))
    return rows


LARGE_WORLD = 256     # ranks from which a bench is announced before its first row (rows then take seconds each)


class RowProgress:
    """Progress of a long bench on stderr: nothing while the work is quick; once it has run `after_s` seconds, one
    line `net bench: ROWS/TOTAL rows (OP, S s)` at most every `every_s` seconds, and a last line when it ends.
    `ranks` >= LARGE_WORLD announces the work at once (its first row alone can take seconds)."""

    def __init__(self, total_rows: int, *, ranks: int = 0, after_s: float = 2.0, every_s: float = 2.0, stream=None,
                 clock=None):
        self.total = total_rows
        self.after_s, self.every_s = after_s, every_s
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock or time.monotonic
        self.start = self.clock()
        self.last: float | None = None
        self.done = 0
        self.op = ""
        self.printed_done = -1
        if ranks >= LARGE_WORLD:
            print(f"net bench: {total_rows} rows on {ranks} ranks; progress follows", file=self.stream, flush=True)

    def row(self, op: str) -> None:
        """Count one finished row of `op`."""
        self.done += 1
        self.op = op
        now = self.clock()
        if now - self.start < self.after_s or (self.last is not None and now - self.last < self.every_s):
            return
        self.last = now
        self._print(now)

    def finish(self) -> None:
        """The closing line, if any progress was shown."""
        if self.last is not None and self.printed_done != self.done:
            self._print(self.clock(), final=True)

    def _print(self, now: float, final: bool = False) -> None:
        what = "done" if final else self.op
        self.printed_done = self.done
        print(f"net bench: {self.done}/{self.total} rows ({what}, {now - self.start:.0f} s)", file=self.stream,
              flush=True)


def format_table(spec: ClusterSpec, op: str, rows: list[Row], n_ranks: int) -> str:
    lines = [
        f"# phantora net bench: {op} on {spec.name} ({spec.nodes} x {spec.gpus_per_node} {spec.gpu}, "
        f"{n_ranks} ranks)",
        "#",
        f"# {'size':>10} {'count':>12} {'type':>6} {'redop':>6} {'root':>5} {'time':>10} {'algbw':>8} {'busbw':>8}"
        f"  {'algo':>5} {'proto':>6}",
        f"# {'(B)':>10} {'(elements)':>12} {'':>6} {'':>6} {'':>5} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8}",
    ]
    for r in rows:
        lines.append(f"  {r.size:>10} {r.count:>12} {r.type:>6} {r.redop:>6} {r.root:>5} {r.time_us:>10.2f} "
                     f"{r.algbw:>8.2f} {r.busbw:>8.2f}  {r.algo:>5} {r.proto:>6}")
    avg = sum(r.busbw for r in rows) / len(rows) if rows else 0.0
    lines.append(f"# Avg bus bandwidth    : {avg:.4f}")
    return "\n".join(lines)


def rows_as_dicts(rows: list[Row]) -> list[dict]:
    return [asdict(r) for r in rows]
