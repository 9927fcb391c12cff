"""`phantora net bench`: the nccl-tests table, computed by the network model.

Columns as nccl-tests prints them (doc/PERFORMANCE.md of NVIDIA/nccl-tests): size (B), count (elements), type, redop,
root, time (us), algbw (GB/s) = size / time, busbw (GB/s) = algbw x the collective's bus factor; plus the algorithm and
protocol the NCCL model picked.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..cluster import ClusterSpec
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
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= factor
    return out


def bench(spec: ClusterSpec, op: str, size_list: list[int], ranks: tuple[int, ...] | None = None,
          network: Network | None = None, progress=None) -> list[Row]:
    net = network or Network(spec)
    ranks = ranks or tuple(range(spec.world_size))
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
