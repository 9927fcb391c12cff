"""The bridge to the cost model: signature of an op, its id in the run's signature table, its cost.

The cost model package (default `phantora.costmodel`, or the one named by `PHANTORA_COSTMODEL`) provides
`<pkg>.signature.signature_of(func, args, kwargs) -> Signature` and `<pkg>.model.CostModel(gpu).estimate(sig) -> Cost`
with fields `duration_s, flops, nbytes, family, source, is_view`; `<pkg>.select.default_cost_model(gpu, profile)`,
when present, picks the measured profiles (the GPU's own, else a cross-GPU fallback; `PHANTORA_PROFILE` names a
profile database explicitly). Costs are cached per signature.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from typing import Any, Callable

from .errors import StubConfigError


@dataclass(frozen=True)
class Costed:
    """What the interceptor needs to emit one kernel."""

    sig_id: int
    duration: float
    flops: float
    nbytes: float
    family: str
    source: int
    is_view: bool


class Coster:
    def __init__(self, gpu: Any, intern: Callable[[str], int], package: str = "phantora.costmodel"):
        try:
            sigmod = importlib.import_module(f"{package}.signature")
            modelmod = importlib.import_module(f"{package}.model")
        except ImportError as exc:
            raise StubConfigError(f"cost model package '{package}' (PHANTORA_COSTMODEL) cannot be imported: {exc}") \
                from None
        self.signature_of = sigmod.signature_of
        self.Signature = sigmod.Signature
        profile = os.environ.get("PHANTORA_PROFILE") or None
        if package == "phantora.costmodel" or importlib.util.find_spec(f"{package}.select") is not None:
            # the package's choice of measured profiles (own GPU's, else a cross-GPU fallback), as replay's
            select = importlib.import_module(f"{package}.select")
            self.model = select.default_cost_model(gpu, profile)
        else:               # a package without `select`: its CostModel as it is
            self.model = modelmod.CostModel(gpu)
        self._intern = intern
        self._cache: dict[Any, Costed] = {}

    def cost(self, func: Any, args: Any, kwargs: Any) -> Costed:
        return self.cost_signature(self.signature_of(func, args, kwargs))

    def cost_signature(self, sig: Any) -> Costed:
        """The cost of a kernel given by its signature (a kernel that is no aten op: Inductor's, compiled.py)."""
        hit = self._cache.get(sig)
        if hit is not None:
            return hit
        c = self.model.estimate(sig)
        is_view = bool(getattr(c, "is_view", False))
        costed = Costed(sig_id=-1 if is_view else self._intern(sig.key()), duration=float(c.duration_s),
                        flops=float(c.flops), nbytes=float(c.nbytes), family=str(getattr(c, "family", "")),
                        source=int(getattr(c, "source", 0)), is_view=is_view)
        self._cache[sig] = costed
        return costed
