"""Errors raised inside a simulated rank, and where in the user's program they happened."""

from __future__ import annotations

import os
import sys

from phantora.errors import PhantoraError, SimulationError


class StubBuildError(PhantoraError):
    """The fake CUDA library could not be built or loaded."""


class UnsupportedOpError(SimulationError):
    """The simulated program called an op the stubs cannot simulate (no fake kernel, data-dependent result...)."""


class StubConfigError(PhantoraError):
    """An environment variable that configures a rank has a bad value."""


_STUBS_DIR = os.path.dirname(os.path.abspath(__file__))
_SKIP_PARTS = (os.sep + "torch" + os.sep, os.sep + "phantora" + os.sep, os.sep + "torchgen" + os.sep)


def _is_library_file(filename: str) -> bool:
    if filename.startswith("<"):
        return True
    path = os.path.abspath(filename)
    if path.startswith(_STUBS_DIR):
        return True
    if any(part in path for part in _SKIP_PARTS):
        return True
    for prefix in (sys.prefix, sys.base_prefix):
        lib = os.path.join(prefix, "lib")
        if path.startswith(lib) and "site-packages" not in path[len(lib):]:
            return True        # the standard library
    return False


def user_location(skip: int = 1) -> str:
    """`file:line in function` of the innermost frame outside torch, the stubs and the standard library.

    Falls back to the innermost non-stub frame when every frame belongs to a library.
    """
    frame = sys._getframe(skip)
    fallback = None
    while frame is not None:
        code = frame.f_code
        if not _is_library_file(code.co_filename):
            return f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
        if fallback is None and not os.path.abspath(code.co_filename).startswith(_STUBS_DIR):
            fallback = f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
        frame = frame.f_back
    return fallback or "<unknown location>"
