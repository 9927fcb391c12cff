"""Phantora rank bootstrap: does nothing unless the environment variable PHANTORA_RANK is set.

`phantora run` puts stubs/ and the project root on the PYTHONPATH of every simulated rank process; Python imports
this module at startup, before the user's program, and it installs the stubs (phantora_stubs.bootstrap).
A sitecustomize that was shadowed by this one is still run.
"""

import os as _os
import sys as _sys


def _chain_shadowed_sitecustomize() -> None:
    import importlib.util

    here = _os.path.dirname(_os.path.abspath(__file__))
    for entry in _sys.path:
        if not entry or _os.path.abspath(entry) == here:
            continue
        candidate = _os.path.join(entry, "sitecustomize.py")
        if _os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_phantora_shadowed_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            return


_chain_shadowed_sitecustomize()

if _os.environ.get("PHANTORA_RANK"):
    from phantora_stubs import bootstrap as _bootstrap

    _bootstrap.install()
