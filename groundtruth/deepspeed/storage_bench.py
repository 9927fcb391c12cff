"""Sequential read and write rates of a host's local storage, as ZeRO-Infinity's NVMe offload uses it: large
requests with O_DIRECT (no page cache) into page-aligned host buffers, from 1 to 8 threads each working on its own
file. Writes JSON to $OUT/storage.json (or stdout) with the device the folder lives on.

    OUT=DIR python groundtruth/deepspeed/storage_bench.py [FOLDER] [GIB_PER_THREAD]
"""
import json
import mmap
import os
import subprocess
import sys
import threading
import time

FOLDER = sys.argv[1] if len(sys.argv) > 1 else "."
GIB = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
BLOCK = 8 << 20                       # bytes per request (DeepSpeed's aio block_size defaults to 1 MiB; 8 given here)


def run(threads: int, write: bool) -> float:
    nbytes = int(GIB * (1 << 30)) // BLOCK * BLOCK
    paths = [os.path.join(FOLDER, f"storage_bench_{i}.bin") for i in range(threads)]
    bufs = [mmap.mmap(-1, BLOCK) for _ in range(threads)]
    for b in bufs:
        b.write(os.urandom(1 << 16) * (BLOCK >> 16))

    def work(i: int) -> None:
        flags = (os.O_WRONLY | os.O_CREAT) if write else os.O_RDONLY
        fd = os.open(paths[i], flags | os.O_DIRECT, 0o644)
        try:
            for off in range(0, nbytes, BLOCK):
                if write:
                    os.pwritev(fd, [bufs[i]], off)
                else:
                    os.preadv(fd, [bufs[i]], off)
            if write:
                os.fsync(fd)
        finally:
            os.close(fd)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return threads * nbytes / (time.perf_counter() - t0) / 1e9


def main() -> None:
    out = {"folder_device": subprocess.run(["df", "--output=source,fstype,size", FOLDER], capture_output=True,
                                           text=True).stdout, "block_bytes": BLOCK, "gib_per_thread": GIB,
           "lsblk": subprocess.run(["lsblk", "-d", "-o", "NAME,MODEL,SIZE,ROTA,TRAN"], capture_output=True,
                                   text=True).stdout, "points": []}
    for threads in (1, 2, 4, 8):
        w = run(threads, True)
        r = run(threads, False)
        out["points"].append({"threads": threads, "write_gbps": round(w, 3), "read_gbps": round(r, 3)})
        print(out["points"][-1], flush=True)
    for f in os.listdir(FOLDER):
        if f.startswith("storage_bench_"):
            os.remove(os.path.join(FOLDER, f))
    emit(out, "storage.json")


def emit(out: dict, name: str) -> None:
    """Prints the results as JSON and writes them to $OUT/NAME where OUT is set."""
    text = json.dumps(out, indent=1)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], name), "w") as fh:
            fh.write(text)
    print(text)


if __name__ == "__main__":
    main()
