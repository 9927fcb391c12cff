"""Where the project's data directories live.

presets/, groundtruth/ and stubs/ sit beside the phantora package in the source tree (the project is installed
editable). PHANTORA_HOME points elsewhere when they have been moved.
"""

from __future__ import annotations

import os
from pathlib import Path


def project_root() -> Path:
    env = os.environ.get("PHANTORA_HOME")
    if env:
        root = Path(env).resolve()
        if not (root / "presets").is_dir():
            from .errors import PhantoraError
            raise PhantoraError(f"PHANTORA_HOME={env} has no presets/ folder: it must name a whole Phantora tree "
                                f"(presets/, groundtruth/, stubs/), or be unset")
        return root
    return Path(__file__).resolve().parent.parent


def presets_dir() -> Path:
    return project_root() / "presets"


def groundtruth_dir() -> Path:
    return project_root() / "groundtruth"


def stubs_dir() -> Path:
    return project_root() / "stubs"
