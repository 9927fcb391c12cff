"""Helpers shared by the click commands."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import click

from .errors import PhantoraError


def user_errors(fn):
    """Report PhantoraError as `Error: ...` without a traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PhantoraError as exc:
            raise click.ClickException(str(exc)) from None
    return wrapper


PLOT_FORMATS = (".png", ".pdf", ".svg", ".jpg", ".jpeg")


def writable_folder(folder: str | Path, what: str) -> None:
    """Refuse, before any work, a folder a file could not be created in (read-only, a pseudo file system, no
    permission): a file is made there and removed again. `what` names the option and its value."""
    import tempfile
    try:
        fd, name = tempfile.mkstemp(prefix=".phantora-probe-", dir=folder)
    except OSError as exc:
        raise PhantoraError(f"{what}: cannot write in {folder} ({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(name)


def not_the_input(out: str, given: str, hint: str) -> None:
    """Refuse an output file that is the input file itself (the same path once relative parts and symbolic links
    are resolved), before any work: writing it would replace the file being read. `hint` names the option."""
    if Path(out).resolve() == Path(given).resolve():
        raise click.BadParameter(f"{out} is the input trace {given}: writing it would replace the trace being "
                                 f"read; give another file", param_hint=hint)


def plot_target(path: str | None) -> None:
    """Refuse a --plot path that could not be written, before any work: its folder must exist, its suffix name an
    image format."""
    if not path:
        return
    target = Path(path)
    if target.suffix.lower() not in PLOT_FORMATS:
        raise PhantoraError(f"--plot {path}: the file name must end in one of {', '.join(PLOT_FORMATS)}")
    if not target.parent.is_dir():
        raise PhantoraError(f"--plot {path}: folder {target.parent} does not exist")
    writable_folder(target.parent, f"--plot {path}")
