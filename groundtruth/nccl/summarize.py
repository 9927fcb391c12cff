"""Combine repeated eager runs of measure_collectives.py into one table per op.

    python groundtruth/nccl/summarize.py groundtruth/nccl/h200x2

reads `<dir>/runs/eager*/<op>.csv` and writes `<dir>/<op>.csv` with, per size, the minimum, median and maximum of
the runs' times (each run's time is the mean over its back-to-back iterations, slowest rank), and algbw / busbw of
the median. The `# key: value` header lines of the first run are kept.
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path


def read(path: Path) -> tuple[list[str], dict[int, float]]:
    lines = path.read_text().splitlines()
    header = [l for l in lines if l.startswith("#")]
    rows = csv.DictReader(l for l in lines if not l.startswith("#"))
    return header, {int(r["size_bytes"]): float(r["time_us"]) for r in rows}


def main(folder: str) -> None:
    base = Path(folder)
    runs = sorted(p for p in (base / "runs").glob("eager*") if p.is_dir())
    ops = sorted(p.stem for p in runs[0].glob("*.csv"))
    for op in ops:
        tables = [read(r / f"{op}.csv") for r in runs]
        header = tables[0][0]
        factor = float(next(l.split(":", 1)[1] for l in header if l.startswith("# busbw_factor")))
        sizes = sorted(tables[0][1])
        with open(base / f"{op}.csv", "w", newline="") as fh:
            for l in header:
                if not l.startswith(("# mode", "# date_utc")):
                    fh.write(l + "\n")
            fh.write(f"# runs: {', '.join(r.name for r in runs)} (eager; time = mean per iteration of each run)\n")
            w = csv.writer(fh)
            w.writerow(["size_bytes", "time_us_min", "time_us_median", "time_us_max", "algbw_gbs", "busbw_gbs"])
            for s in sizes:
                ts = [t[1][s] for t in tables]
                med = statistics.median(ts)
                algbw = s / med / 1e3
                w.writerow([s, f"{min(ts):.2f}", f"{med:.2f}", f"{max(ts):.2f}", f"{algbw:.2f}", f"{algbw * factor:.2f}"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).parent / "h200x2"))
