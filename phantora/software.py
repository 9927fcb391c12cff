"""Names shared by the cluster's `[software]` section, the rank stubs and validation: SDPA backends, torch
releases and the Transformer Engine releases the stand-in answers as. Imports nothing heavy, so the stubs can use it before torch is imported."""

from __future__ import annotations

import re

SDPA_BACKENDS = ("cudnn", "flash", "efficient", "math")
_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.\d+)?(?:[.+a-z].*)?")


def parse_release(text: str) -> tuple[int, int] | None:
    """(major, minor) of a torch release or version string ('2.6', '2.11.0', '2.13.0+cpu', '2.6.0a0+git'); None if
    it is not one."""
    m = _RELEASE.fullmatch(text.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


CUDNN_FIRST_FROM = (2, 9)        # from this release, a CUDA build tries cuDNN attention first ...
CUDNN_FIRST_SM = (90, 100)       # ... on these GPUs (compute capability x 10)


def default_sdpa_order(release: tuple[int, int], sm: int) -> tuple[str, ...]:
    """The SDPA backend order a CUDA build of `release` starts with on a GPU of compute capability `sm`."""
    if release >= CUDNN_FIRST_FROM and sm in CUDNN_FIRST_SM:
        return ("cudnn", "flash", "efficient", "math")
    return ("flash", "efficient", "math", "cudnn")


TE_FIRST_RELEASE = (2, 0)        # the Transformer Engine stand-in follows TE 2.x's Python API


def te_release_problem(text: str) -> str | None:
    """Why `text` cannot name the Transformer Engine release the ranks import (None if it can)."""
    release = parse_release(text)
    if release is None:
        return f"'{text}' is not a Transformer Engine release like 2.9 or 2.9.0"
    if release < TE_FIRST_RELEASE:
        return (f"Transformer Engine {text}: the stand-in follows the API of TE "
                f"{TE_FIRST_RELEASE[0]}.{TE_FIRST_RELEASE[1]} and later")
    if release[0] > TE_FIRST_RELEASE[0]:
        return (f"Transformer Engine {text}: the stand-in follows the API of TE {TE_FIRST_RELEASE[0]}.x, which a "
                f"release {release[0]}.x need not keep")
    return None
