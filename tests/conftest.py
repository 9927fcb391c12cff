"""Fixtures shared by the tests that start simulated rank processes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def stub_cache(tmp_path_factory) -> Path:
    """A private cache with the fake CUDA library built once (compiled only; never loaded in this process)."""
    if str(ROOT / "stubs") not in sys.path:
        sys.path.insert(0, str(ROOT / "stubs"))
    from phantora_stubs import build  # no torch import: safe in the test process

    cache = tmp_path_factory.mktemp("phantora-cache")
    torch_install = build.find_torch()
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    try:
        build.build(torch_install, build.library_path(torch_install))
    finally:
        if old is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = old
    return cache
