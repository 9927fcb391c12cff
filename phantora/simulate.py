"""Run the engine on op streams given in memory and record the result as a trace (synthetic workloads and tests;
live runs feed the same engine from their ranks, replay from a trace)."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

from . import __version__
from .cluster import ClusterSpec
from .engine.core import Engine
from .engine.ops import Op
from .engine.recorder import Recorder
from .gcpause import gc_paused


def run_meta(spec: ClusterSpec, command: list[str], simulated: list[int], rank_map: list[int], mode: str,
             **extra) -> dict:
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:  # pragma: no cover
        torch_version = None
    return {"command": command, "cluster": spec.to_table(), "gpu": spec.gpu, "world_size": spec.world_size,
            "ranks": simulated, "rank_map": rank_map, "mode": mode, "phantora_version": __version__,
            "torch_version": torch_version, "python_version": platform.python_version(), **extra}


def simulate_streams(spec: ClusterSpec, streams: dict[int, list[Op]], out: str | Path, *,
                     groups: dict[int, tuple[str, list[int]]] | None = None, signatures: list[str] = (),
                     rank_map: list[int] | None = None, meta: dict | None = None) -> Engine:
    """Simulate complete op streams of the given ranks and write the trace to `out`."""
    from .trace.writer import TraceWriter

    simulated = sorted(streams)
    rank_map = rank_map or list(range(spec.world_size))
    full_meta = run_meta(spec, meta.pop("command", sys.argv) if meta else sys.argv, simulated, rank_map, "live")
    full_meta.update(meta or {})
    writer = TraceWriter(str(out), full_meta)
    for s in signatures:
        writer.add_signature(s)
    recorder = Recorder(writer)
    engine = Engine(spec, simulated=simulated, rank_map=rank_map, sink=recorder)
    recorder.attach(engine)
    for gid, (name, ranks) in sorted((groups or {}).items()):
        engine.add_group(gid, ranks, name)
    for gid, g in engine.groups.items():
        writer.add_group(gid, g.ranks, g.name)
    try:
        with gc_paused():
            for r in simulated:
                engine.feed(r, streams[r])
                engine.close(r)
            done = engine.run()
            recorder.flush()
    except BaseException as e:
        writer.close(error=f"{type(e).__name__}: {e}")
        raise
    writer.update_meta({"complete_simulation": bool(done and not recorder.missing())})
    writer.close()
    return engine
