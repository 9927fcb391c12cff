"""Presenting a suite's results: an nccl-tests-like terminal table, Markdown, JSON and a plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from phantora.errors import PhantoraError

from .compare import LABELS, CaseResult

COLUMNS = ("case", "metric", "measured", "simulated", "error", "cost source")


def _num(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "OOM" if v else "fits"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}" if abs(v) < 1 else f"{v:.1f}"


def _err(row_error: float | None, ok: bool, metric: str) -> str:
    if metric == "oom":
        return "ok" if ok else "MISMATCH"
    if row_error is None:
        return "n/a"
    return f"{100 * row_error:+.2f}%"


def rows_of(results: list[CaseResult]) -> list[list[str]]:
    """One list of cells per table line (the case and cost source only on a case's first line)."""
    out = []
    for res in results:
        if res.failure is not None:
            out.append([res.case, "-", "-", "-", "FAILED", " ".join(res.failure.split())])
            continue
        src = res.sim.cost_source if res.sim else "-"
        for i, row in enumerate(res.rows):
            out.append([res.case if i == 0 else "", LABELS.get(row.metric, row.metric), _num(row.measured),
                        _num(row.simulated), _err(row.error, row.ok, row.metric), src if i == 0 else ""])
            if row.spread is not None:
                lo, hi, runs = row.spread
                outside = row.spread_error
                said = "n/a" if outside is None else ("inside" if outside == 0.0 else f"{100 * outside:+.2f}% out")
                out.append(["", f"{LABELS.get(row.metric, row.metric)}, {runs} runs", f"{lo:.3g}-{hi:.3g}",
                            f"{row.simulated:.3g}" if row.simulated is not None else "-", said, ""])
    return out


def summary_lines(summary: dict[str, Any], max_error: float | None = None) -> list[str]:
    avg, mx = summary["avg_abs_error"], summary["max_abs_error"]
    lines = []
    if avg is None:
        lines.append(f"Avg abs error: n/a   Max abs error: n/a   (no case compared; {summary['cases']} cases)")
    else:
        lines.append(f"Avg abs error: {100 * avg:.2f}%   Max abs error: {100 * mx:.2f}% ({summary['max_case']})   "
                     f"[primary metric; {summary['compared']} of {summary['cases']} cases compared]")
    if summary["oom_cases"]:
        lines.append(f"OOM rows predicted: {summary['oom_correct']} of {summary['oom_cases']}")
    if summary.get("spread_cases"):
        lines.append(f"Measured spread (records with repeated runs, compared): simulated inside the runs' range "
                     f"in {summary['within_spread']} of {summary['spread_cases']}")
    if summary["oom_mismatches"]:
        lines.append(f"OOM mismatches: {summary['oom_mismatches']}")
    if summary["failed"]:
        lines.append(f"Failed cases: {summary['failed']}")
    for metric, s in sorted(summary["by_metric"].items()):
        lines.append(f"  {LABELS.get(metric, metric)}: avg {100 * s['avg_abs_error']:.2f}%, "
                     f"max {100 * s['max_abs_error']:.2f}% over {s['n']}")
    if max_error is not None:
        lines.append(f"Limit: {max_error:g}% -> {'PASS' if passes(summary, max_error) else 'FAIL'}")
    return lines


def passes(summary: dict[str, Any], max_error: float | None) -> bool:
    """No failed case, no OOM mismatch, and (with a limit, in percent) the maximum primary error within it."""
    if summary["failed"] or summary["oom_mismatches"]:
        return False
    if max_error is not None and summary["max_abs_error"] is not None:
        return 100 * summary["max_abs_error"] <= max_error
    return True


def format_table(suite: str, results: list[CaseResult], summary: dict[str, Any],
                 max_error: float | None = None) -> str:
    body = rows_of(results)
    widths = [max([len(COLUMNS[i])] + [len(r[i]) for r in body]) for i in range(5)]
    right = (False, False, True, True, True)

    def line(cells: list[str], lead: str) -> str:
        parts = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells[:5], widths, right)]
        return (lead + "  ".join(parts) + "  " + cells[5]).rstrip()

    out = [f"# phantora-validate: suite '{suite}', {len(results)} cases", "#",
           line(list(COLUMNS), "# "), *(line(r, "  ") for r in body)]
    out += ["#"] + ["# " + s for s in summary_lines(summary, max_error)]
    return "\n".join(out)


def format_markdown(suite: str, results: list[CaseResult], summary: dict[str, Any],
                    max_error: float | None = None) -> str:
    out = [f"# Validation: suite `{suite}`", "", "| " + " | ".join(COLUMNS) + " |",
           "|" + "---|" * 2 + "---:|" * 3 + "---|"]
    for r in rows_of(results):
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
    out += [""] + [f"- {s.strip()}" for s in summary_lines(summary, max_error)]
    return "\n".join(out) + "\n"


def plot(suite: str, results: list[CaseResult], path: str | Path, max_error: float | None = None) -> None:
    """A bar chart of each compared case's primary error (percent), with the limit as dashed lines."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PhantoraError("--plot needs matplotlib (pip install 'phantora[plot]')") from None
    shown = [r for r in results if r.error is not None]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.5 * len(shown) + 2), 4.5))
    xs = range(len(shown))
    ax.bar(xs, [100 * r.error for r in shown], color=["tab:blue" if r.error >= 0 else "tab:orange" for r in shown])
    ax.axhline(0, color="black", linewidth=0.8)
    if max_error is not None:
        for y in (max_error, -max_error):
            ax.axhline(y, color="tab:red", linestyle="--", linewidth=0.8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([r.case for r in shown], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("simulated vs measured (%)")
    ax.set_title(f"phantora-validate --suite {suite}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
