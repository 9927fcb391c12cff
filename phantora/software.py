"""Names shared by the cluster's `[software]` section, the rank stubs and validation: SDPA backends and torch
releases. Imports nothing heavy, so the stubs can use it before torch is imported."""

from __future__ import annotations

import re

SDPA_BACKENDS = ("cudnn", "flash", "efficient", "math")
_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.\d+)?(?:[.+a-z].*)?")


def parse_release(text: str) -> tuple[int, int] | None:
    """(major, minor) of a torch release or version string ('2.6', '2.11.0', '2.13.0+cpu', '2.6.0a0+git'); None if
    it is not one."""
    m = _RELEASE.fullmatch(text.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None
