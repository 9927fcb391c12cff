"""Functional collectives' results as on a GPU: an `AsyncCollectiveTensor`, waited for at its first use.

`torch.distributed._functional_collectives` (DTensor's redistributions, `funcol.all_reduce`...) returns an
`AsyncCollectiveTensor` wrapping the collective's output, and waits for the collective (`wait_tensor`) only when an
op first uses the result or `.wait()` is called; while tracing (`_are_we_tracing()`: Dynamo compiling, a fake-tensor
mode, a proxy mode or the Python dispatcher on) it waits at once and returns a plain tensor. A simulated rank runs
under its own fake-tensor mode (fake.py), which made every call take the tracing path: the current stream waited for
the collective right after issuing it, work issued before the first use did not overlap it, and `.wait()` on a
result failed with an AttributeError. Here the rank's own fake mode does not count as tracing; any other (a
program's own `FakeTensorMode`), Dynamo, a proxy mode and the Python dispatcher still do, as in PyTorch.
"""

from __future__ import annotations

import torch

_FAKE = torch._C._TorchDispatchModeKey.FAKE


def install(rank_fake_mode) -> None:
    """Patch `_are_we_tracing` of the functional collectives (idempotent)."""
    import torch.distributed._functional_collectives as funcol
    if getattr(funcol._are_we_tracing, "__phantora__", False):
        return
    original = funcol._are_we_tracing

    def _are_we_tracing() -> bool:
        if torch._C._get_dispatch_mode(_FAKE) is not rank_fake_mode:
            return original()
        if torch.compiler.is_dynamo_compiling():
            return True
        if torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.PythonDispatcher):
            return True
        from torch.fx.experimental.proxy_tensor import get_proxy_mode
        return get_proxy_mode() is not None

    _are_we_tracing.__phantora__ = True
    funcol._are_we_tracing = _are_we_tracing
