"""Hugging Face `datasets`' caches of transformed datasets, off in a simulated rank.

`Dataset.shuffle`, `map`, `filter` and the other transforms write their result next to the dataset's cache files,
named by the transform's fingerprint, and a later run that asks for the same transform loads that file instead of
computing it. The two paths run different Python (TorchTitan reshuffles its dataset each time it runs out:
computing the shuffle's indices takes about 1,800 Python calls, loading them from the cache about 1,200), so the
simulated steps that re-loop the data would depend on what earlier runs left on the simulating machine's disk: the
first run of a command and the second would differ (by 2% in the steps of TorchTitan's debug model that re-loop its
test dataset). `datasets.disable_caching()` makes every run compute its transforms, into a temporary directory;
their results are the same (a shuffle with the same seed gives the same order). A prepared dataset itself
(`load_dataset`'s cache) is still read from the cache: preparing it or loading it happens once, before training
(docs/host-cpu.md).
"""

from __future__ import annotations

from typing import Any


def patch(module: Any) -> None:
    """Turn off the reuse of transform caches (`datasets.disable_caching`), once `datasets` is imported."""
    disable = getattr(module, "disable_caching", None)
    if disable is not None:
        disable()
