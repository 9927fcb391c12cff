"""transformer_engine.pytorch.ops: TE's operation-fuser API. Not modelled: its classes exist (frameworks name them
in annotations and subclass checks) and refuse to be built."""

from __future__ import annotations

from typing import Any

from .module.base import NotModelled


class FusibleOperation:
    def __init__(self, *args: Any, **kwargs: Any):
        raise NotModelled(f"transformer_engine.pytorch.ops.{type(self).__name__}: TE's operation fuser is not "
                          f"modelled (Megatron-core: use_te_op_fuser=False)")


def __getattr__(name: str) -> Any:
    if name[:1].isupper():
        cls = type(name, (FusibleOperation,), {"__module__": __name__})
        globals()[name] = cls
        return cls
    raise AttributeError(name)
