"""`phantora-validate --suite NAME`: simulate each ground-truth case of a suite and report the error.

The suites are built from the records under groundtruth/; until a suite has records, the command says so and
exits non-zero rather than reporting an empty success.
"""

from __future__ import annotations

import sys

import click

from phantora.paths import groundtruth_dir


def available_suites() -> list[str]:
    root = groundtruth_dir()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and any(p.glob("*.toml")))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--suite", required=True, help="Suite name (a folder of records under groundtruth/).")
def main(suite: str) -> None:
    """Compare Phantora's simulated results with measured ground truth.

    \b
    Example:
      phantora-validate --suite torchtitan
    """
    suites = available_suites()
    if suite not in suites:
        known = ", ".join(suites) if suites else "none yet"
        click.echo(f"Error: no ground-truth suite '{suite}' (suites with records: {known})", err=True)
        sys.exit(2)
    click.echo(f"Error: suite '{suite}' has records but no runner for them yet", err=True)
    sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
