"""Record what PyTorch's CUDA caching allocator does during a real run (device tool).

    python -m phantora.probes.allocprobe --out OUT.json.gz -- SCRIPT.py [ARGS...]

Runs the script in this process with `torch.cuda.memory._record_memory_history` on from the first allocation, then
writes every allocator event of device 0 in the order it happened: block allocations and frees (size, stream,
address) and the segments the allocator took from or gave back to the driver (`segment_alloc`/`segment_free`,
and `segment_map`/`segment_unmap` under `expandable_segments:True`), with `torch.cuda.memory_stats()` at the end
and the allocator settings of the run (`PYTORCH_CUDA_ALLOC_CONF` / `PYTORCH_ALLOC_CONF`). Read only: nothing on
the GPU is changed.

tests/test_allocator_measured.py replays the recorded block events through Phantora's allocator model
(phantora.engine.allocator) and compares the memory it reserves with what the real allocator reserved.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import runpy
import sys

ACTIONS = ("alloc", "free_completed", "segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom")
MAX_ENTRIES = 4_000_000


def _events(snapshot: dict, device: int) -> list[list]:
    traces = snapshot.get("device_traces") or []
    if device >= len(traces):
        return []
    return [[e["action"], int(e.get("stream", 0)), int(e.get("addr", 0)), int(e.get("size", 0))]
            for e in traces[device] if e["action"] in ACTIONS]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(prog="python -m phantora.probes.allocprobe",
                                usage="%(prog)s --out OUT.json.gz -- SCRIPT.py [ARGS...]",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output file (.json.gz)")
    p.add_argument("--memory-fraction", type=float, default=None,
                   help="torch.cuda.set_per_process_memory_fraction before the run (the allocator then has to "
                        "give cached memory back and retry, as on a fuller GPU)")
    if "--" not in argv:
        p.error("give the script to run after --")
    cut = argv.index("--")
    args = p.parse_args(argv[:cut])
    script = argv[cut + 1:]
    if not script:
        p.error("give the script to run after --")

    import torch

    if not torch.cuda.is_available():
        print("allocprobe: no CUDA GPU is visible", file=sys.stderr)
        return 2
    if args.memory_fraction is not None:
        torch.cuda.set_per_process_memory_fraction(args.memory_fraction)
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=MAX_ENTRIES)
    sys.argv = list(script)
    code, error = 0, None
    try:
        runpy.run_path(script[0], run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception as e:  # noqa: BLE001 - an OOM in the script is a result too: keep its events
        error = f"{type(e).__name__}: {e}"
        code = 1
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = _events(snap, torch.cuda.current_device())
    stats = {k: int(v) for k, v in torch.cuda.memory_stats().items() if isinstance(v, (int, float))}
    info = {"command": " ".join(["python", "-m", "phantora.probes.allocprobe"] + argv[:cut] + ["--"] + script),
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "capacity_bytes": torch.cuda.get_device_properties(0).total_memory,
            "memory_fraction": args.memory_fraction,
            "alloc_conf": {k: os.environ[k] for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
                           if k in os.environ},
            "max_entries": MAX_ENTRIES, "events": len(events), "returncode": code,
            "error": error}
    with gzip.open(args.out, "wt") as f:
        json.dump({"info": info, "stats": stats, "events": events}, f, separators=(",", ":"))
    print(f"allocprobe: {len(events)} events, peak reserved {stats.get('reserved_bytes.all.peak', 0) / 2**30:.2f} "
          f"GiB, peak allocated {stats.get('allocated_bytes.all.peak', 0) / 2**30:.2f} GiB -> {args.out}")
    return code


if __name__ == "__main__":
    sys.exit(main())
