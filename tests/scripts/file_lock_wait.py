"""A rank waits for a file lock another process holds for HOLD_S real seconds; prints the virtual seconds the wait
took (time.perf_counter across acquire) as one JSON line."""
import json
import subprocess
import sys
import time

from filelock import FileLock

path, hold_s = sys.argv[1], float(sys.argv[2])
holder = subprocess.Popen([sys.executable, "-c", f"import time, filelock, sys\nwith filelock.FileLock({path!r}):\n"
                           f"    print('held', flush=True)\n    time.sleep({hold_s})"], stdout=subprocess.PIPE, text=True)
assert holder.stdout.readline().strip() == "held"
t0 = time.perf_counter()
with FileLock(path, timeout=60):
    waited = time.perf_counter() - t0
holder.wait()
print(json.dumps({"waited_s": waited}), flush=True)
