"""Count the Python lines a training script runs on a real GPU host, the work the host-CPU model prices per line.

    python groundtruth/hostcpu/line_count.py OUT.json -- presets/workloads/deepspeed_gpt.py ARGS...

Runs the script in this process (as `python SCRIPT ARGS` would, `__name__ == "__main__"`) and counts CPython's line
events in every thread of the interpreter, the autograd engine's device threads among them (backward hooks run
there on a GPU host): a line starting to run, or run again after a jump back (each iteration of a loop), as the
simulation's counter counts them (stubs/phantora_stubs/csrc/host_counter.cpp). On Python 3.12 and later it uses
`sys.monitoring` (LINE events, and the JUMP events that go back within one line, which the trace function
reports as that line run again); before 3.12 a trace function (`sys.settrace`, `threading.settrace`), which does not see threads
that C++ started, such as autograd's. Writes the total, the wall time and the lines of each function that ran at
least 20 (file, name, lines) to OUT.json.

Run the same command with two step counts: the difference of the totals over the difference of the steps is the
lines of one step, to set against the `host_line` column of a simulated trace of the same command
(docs/host-cpu.md). The count includes what the simulation does not count (torch.cuda's own Python wrappers, which
the stubs replace) and slows the program down; only the counts are used.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import threading
import time
from collections import Counter

COUNT = [0]
BY_CODE: Counter = Counter()


def _line(code, _line_number):
    COUNT[0] += 1
    BY_CODE[code] += 1


LINES_OF: dict = {}


def _line_at(code, offset: int):
    table = LINES_OF.get(code)
    if table is None:
        table = LINES_OF[code] = list(code.co_lines())
    for start, end, line in table:
        if start <= offset < end:
            return line
    return None


def _jump(code, source, destination):
    # a jump back within one line (a loop or comprehension written on one line) runs that line again, which the
    # trace function reports as a line event and LINE does not (it fires only when the line changes)
    if destination <= source and _line_at(code, source) == _line_at(code, destination):
        COUNT[0] += 1
        BY_CODE[code] += 1


def _trace(frame, event, arg):
    if event == "line":
        COUNT[0] += 1
        BY_CODE[frame.f_code] += 1
    return _trace


def _start() -> str:
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is None:
        threading.settrace(_trace)
        sys.settrace(_trace)
        return "settrace"
    tool = monitoring.PROFILER_ID
    monitoring.use_tool_id(tool, "line_count")
    monitoring.register_callback(tool, monitoring.events.LINE, _line)
    monitoring.register_callback(tool, monitoring.events.JUMP, _jump)
    monitoring.set_events(tool, monitoring.events.LINE | monitoring.events.JUMP)
    return "sys.monitoring"


def _stop(how: str) -> None:
    if how == "settrace":
        sys.settrace(None)
        threading.settrace(None)
        return
    monitoring = sys.monitoring
    monitoring.set_events(monitoring.PROFILER_ID, 0)
    monitoring.free_tool_id(monitoring.PROFILER_ID)


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit(__doc__)
    out, script, args = sys.argv[1], sys.argv[3], sys.argv[4:]
    sys.argv = [script, *args]
    t0 = time.perf_counter()
    how = _start()
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        _stop(how)
        by_function: Counter = Counter()
        for code, n in BY_CODE.items():
            by_function[code.co_filename, code.co_name] += n
        with open(out, "w") as f:
            json.dump({"lines": COUNT[0], "wall_s": time.perf_counter() - t0, "argv": [script, *args], "counter": how,
                       "functions": [[_short(path), name, n] for (path, name), n in by_function.most_common()
                                     if n >= 20]}, f)


def _short(path: str) -> str:
    """A code file's name without the host's folders: from site-packages, or from the working directory."""
    if "site-packages/" in path:
        return path.split("site-packages/")[-1]
    return os.path.relpath(path) if path.startswith(os.getcwd() + os.sep) else path


if __name__ == "__main__":
    main()
