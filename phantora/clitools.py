"""Helpers shared by the click commands."""

from __future__ import annotations

import functools

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
