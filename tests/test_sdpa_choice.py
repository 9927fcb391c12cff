"""SDPA's backend choice under simulation against the choice measured on an H200.

groundtruth/insitu/sdpa_choice.py ran 236 attention cases on an H200 (torch 2.11, cuDNN 9.19) and recorded, per
case, the backend `torch._fused_sdp_choice` names, what `torch.backends.cuda.can_use_*_attention` answers for each
fused backend, the aten attention ops a forward (and backward) ran, and the first attention op's argument dtypes
and shapes (padded head dims, converted masks). The same script under `phantora run` on the simulated H200 must
print the same for every case."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GT = ROOT / "groundtruth" / "insitu"


def _rank_json(stdout: str) -> dict:
    prefix = "[rank0]: "
    text = "\n".join(line[len(prefix):] if line.startswith(prefix) else line for line in stdout.splitlines())
    doc, _ = json.JSONDecoder().raw_decode(text[text.index("{"):])
    return doc


def test_sdpa_picks_the_backend_a_gpu_picks():
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHANTORA_") and k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "run", "--cluster", "h200-1gpu", "--no-trace", "--",
                           "python", str(GT / "sdpa_choice.py")], capture_output=True, text=True, timeout=600,
                          cwd=str(ROOT), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    simulated = _rank_json(proc.stdout)
    measured = json.loads((GT / "h200-sdpa" / "sdpa_choice.json").read_text())
    assert simulated["priority"] == measured["priority"]
    assert [r["case"] for r in simulated["rows"]] == [r["case"] for r in measured["rows"]]
    wrong = []
    for got, want in zip(simulated["rows"], measured["rows"]):
        for key in ("choice", "can_use", "ops", "args"):
            if got.get(key) != want.get(key):
                wrong.append((want["case"], key, want.get(key), got.get(key), got.get("error")))
    assert not wrong, f"{len(wrong)} of {len(measured['rows'])} cases differ, first: {wrong[:3]}"
