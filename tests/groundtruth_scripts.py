"""Load a measurement script kept beside its data under groundtruth/ (not a package) as a module."""

import importlib.util

from phantora.paths import groundtruth_dir


def load_script(relpath: str):
    """groundtruth/<relpath> (e.g. "insitu/compare_kernels.py") as a module."""
    path = groundtruth_dir() / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
