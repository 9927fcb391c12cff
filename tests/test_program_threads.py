"""GPU ops of threads the program starts are not simulated; each such thread is named once on rank 0's stderr, and
the main thread and the autograd engine's threads are not (stubs/phantora_stubs/program_threads.py)."""

import re
import subprocess
import sys

from conftest import ROOT


def test_a_program_threads_gpu_ops_are_named_once_per_thread(tmp_path):
    script = str(ROOT / "tests" / "scripts" / "program_thread_ops.py")
    proc = subprocess.run([sys.executable, "-m", "phantora.cli", "run", "--cluster", "h200-1gpu", "--trace",
                           str(tmp_path / "t.h5"), "--", sys.executable, script],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done" in proc.stdout
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "outside the simulation" in ln]
    named = [re.search(r"thread '([^']+)' ran (\S+)", ln).groups() for ln in lines]
    assert sorted(named) == [("prefetch", "aten.mm.default"), ("writer", "aten.mm.default")], lines
