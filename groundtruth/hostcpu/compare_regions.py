"""Compare the host time per region of two `fsdp_regions.py` outputs (a GPU host's and the simulation's).

    python groundtruth/hostcpu/compare_regions.py HOST.json SIMULATED.json

Prints, per region, ms per step on each side, their ratio and the calls per step. torch 2.11's FSDP2 calls
`all_gather_into_tensor` / `reduce_scatter_tensor` where torch 2.13's calls `all_gather_single` /
`reduce_scatter_single`: they are compared as one region.
"""

from __future__ import annotations

import json
import sys

SAME = {"dist.all_gather_into_tensor": "dist.all_gather_single",
        "dist.reduce_scatter_tensor": "dist.reduce_scatter_single"}


def regions(path: str) -> dict[str, dict]:
    return {SAME.get(k, k): v for k, v in json.loads(open(path).read())["regions"].items()}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    host, sim = regions(argv[0]), regions(argv[1])
    print(f"{'region':45s} {'host ms':>9s} {'sim ms':>9s} {'ratio':>6s}  calls (host / sim)")
    for name in sorted(set(host) | set(sim)):
        h, s = host.get(name, {}), sim.get(name, {})
        a, b = h.get("ms_per_step", 0.0), s.get("ms_per_step", 0.0)
        ratio = f"{a / b:6.2f}" if b else "     -"
        print(f"{name:45s} {a:9.3f} {b:9.3f} {ratio}  {h.get('calls_per_step', 0):.0f} / {s.get('calls_per_step', 0):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
