"""Host time of torch.compile's later compilations: the reference workload's Llama with each block compiled
(`fullgraph=True`, as `llama.py --compile`), trained through a schedule of sequence lengths, so that a new length
makes Dynamo compile the blocks again (the second length: a recompilation with dynamic shapes, by Dynamo's default
`automatic_dynamic_shapes`; later lengths: served by that graph).

    python groundtruth/local/compile_times.py [--model llama3.2-1b] [--batch 4] [--schedule 2048x4,1024x4,1536x4,2048x2]

Prints one JSON line per step (sequence length, step seconds, Dynamo's frames compiled so far) and a SUMMARY line.
On a GPU host run it with empty compile caches (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR set to new folders), as a
new job's first run; under `phantora run` it runs on the simulated GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "presets" / "workloads"))
from llama import Transformer  # noqa: E402
from workload_common import load_model_args  # noqa: E402


def schedule(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        seq, _, n = part.partition("x")
        out += [int(seq)] * int(n or 1)
    return out


def frames_compiled() -> int:
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama3.2-1b")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--schedule", default="2048x4,1024x4,1536x4,2048x2", help="SEQxSTEPS,... in order")
    a = p.parse_args(argv)
    seqs = schedule(a.schedule)
    args = load_model_args(a.model, a.layers)
    torch.manual_seed(0)
    model = Transformer(args, max(seqs)).to(device="cuda", dtype=torch.bfloat16)
    model.init_weights()
    for block in model.layers.values():
        block.compile(fullgraph=True)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    rows = []
    for step, seq in enumerate(seqs, 1):
        tokens = torch.randint(0, args.vocab_size, (a.batch, seq), device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten(0, 1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        rows.append({"step": step, "seq": seq, "step_s": dt, "graphs": frames_compiled()})
        print(json.dumps(rows[-1]), flush=True)
    steady = {}                          # per length: the median of its steps after its first
    for s in dict.fromkeys(seqs):
        later = [r["step_s"] for r in rows if r["seq"] == s][1:]
        if later:
            steady[s] = statistics.median(later)
    print("SUMMARY " + json.dumps({"model": a.model, "batch": a.batch, "schedule": a.schedule,
                                   "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                   "steps": rows, "steady_step_s": steady}), flush=True)


if __name__ == "__main__":
    main()
