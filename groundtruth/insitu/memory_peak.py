"""What a GPU process holds at its peak of allocated memory, and which code allocated it (on a GPU host).

Runs a training script as its `__main__` with PyTorch's allocator history on
(`torch.cuda.memory._record_memory_history`, Python frames), and at exit replays the recorded allocations and frees
of rank 0 to the moment the allocated bytes peaked, then writes the blocks alive at that moment, largest first,
each with its size, the innermost frames of the code that allocated it and whether its free had been requested
(a block freed by its owner stays allocated until the streams that used it reach the free: `free_requested` before
`free_completed`), and the allocator's last events before the peak.

    torchrun --standalone --nproc-per-node 1 groundtruth/insitu/memory_peak.py --out PEAK.json -- \\
        presets/workloads/megatron_gpt.py --model llama3.2-1b --seq 4096 --micro-batch 1 --recompute full ...

The peak it finds is the peak of `torch.cuda.max_memory_allocated` while the history was on (from the start).
"""

import json
import os
import runpy
import sys

import torch

MiB = 2**20


def _short(path):
    """A code file's name without the host's folders: relative to the import path entry or working directory that
    holds it (the longest such)."""
    roots = sorted({os.path.abspath(p or ".") for p in sys.path} | {os.getcwd()}, key=len, reverse=True)
    for root in roots:
        if path.startswith(root + os.sep):
            return path[len(root) + 1:]
    return path


def _frames(entry, n=6):
    out = []
    for fr in entry.get("frames", []):
        name = fr.get("filename", "")
        if "/torch/" in name and "/torch/nn/modules/module.py" not in name:
            continue
        out.append(f"{_short(name)}:{fr.get('line')} {fr.get('name')}")
        if len(out) == n:
            break
    return out


def _peak(snapshot):
    events = [e for trace in snapshot["device_traces"][:1] for e in trace]
    live, total, best, best_at = {}, 0, -1, -1
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            live[e["addr"]] = e
            total += e["size"]
        elif e["action"] == "free_completed" and e["addr"] in live:
            total -= live.pop(e["addr"])["size"]
        if total > best:
            best, best_at = total, i
    live, requested = {}, set()
    for e in events[:best_at + 1]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
            requested.discard(e["addr"])
        elif e["action"] == "free_requested":
            requested.add(e["addr"])
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
            requested.discard(e["addr"])
    blocks = sorted(live.values(), key=lambda e: -e["size"])
    recent = [e for e in events[max(0, best_at - 60):best_at + 1]
              if e["action"] in ("alloc", "free_requested", "free_completed")]
    return {"peak_mib": best / MiB, "events": len(events), "peak_event": best_at,
            "blocks_alive": len(blocks),
            "largest": [{"mib": e["size"] / MiB, "frames": _frames(e), "free_requested": e["addr"] in requested}
                        for e in blocks[:40]],
            "pending_free_mib": sum(e["size"] for e in blocks if e["addr"] in requested) / MiB,
            "before_peak": [{"action": e["action"], "mib": e["size"] / MiB, "frames": _frames(e, 3)}
                            for e in recent]}


def main():
    argv = sys.argv[1:]
    out = None
    if argv[:1] == ["--out"]:
        out, argv = argv[1], argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    sys.argv = argv
    try:
        runpy.run_path(argv[0], run_name="__main__")
    finally:
        if int(os.environ.get("RANK", "0")) == 0 and out:
            result = _peak(torch.cuda.memory._snapshot())
            result["max_memory_allocated_mib"] = torch.cuda.max_memory_allocated() / MiB
            with open(out, "w") as f:
                json.dump(result, f, indent=1)
            print(f"memory_peak: {result['peak_mib']:.1f} MiB at event {result['peak_event']} of "
                  f"{result['events']}", flush=True)


if __name__ == "__main__":
    main()
