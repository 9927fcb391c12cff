"""The routing a simulated mixture-of-experts step assumes: how many tokens each expert receives.

A router picks experts from the values of its scores, which a simulation does not have (fake tensors). So a run
assumes a distribution of the picks over the experts, given by `phantora run --routing` and recorded in the trace's
meta (`routing`):
- `balanced` (the default): every expert gets the same share, as the original Phantora assumed (uniform split);
- `zipf:S`: expert e (0-based) gets a share proportional to 1 / (e + 1) ** S (S > 0): expert 0 is the busiest, so
  the expert-parallel rank holding the first experts receives the most tokens;
- `loads:L0,L1,...` (or, on the command line, `file:PATH`, a file of one number per expert, e.g. measured on a
  real run): shares proportional to the given non-negative loads, one per expert.

`expert_counts(spec, tokens, top_k, experts)` turns a distribution into the integer token counts one rank routes to
each expert: `tokens * top_k` picks split by the shares, no expert getting more than `tokens` (a token picks `top_k`
distinct experts; the excess of a capped expert goes to the others in proportion), rounded by largest remainder
(ties to the lower expert). Every rank of a run routes by the same shares, so the counts are a function of the run's
option and the token count alone. Imports nothing heavy: the rank stubs and the launcher share it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import PhantoraError

OPTION = "--routing"
KINDS = ("balanced", "zipf", "loads")
ENV = "PHANTORA_ROUTING"


class RoutingError(PhantoraError):
    """A routing distribution that cannot be used (bad option value, loads that do not fit the model)."""


@dataclass(frozen=True)
class RoutingSpec:
    kind: str = "balanced"                 # balanced | zipf | loads
    exponent: float = 0.0                  # zipf: the exponent S
    loads: tuple[float, ...] = ()          # loads: one relative load per expert
    source: str = ""                       # loads: the file they were read from (for reports), "" otherwise

    def text(self) -> str:
        """The form `parse` reads back (the value of PHANTORA_ROUTING)."""
        if self.kind == "zipf":
            return f"zipf:{self.exponent!r}"
        if self.kind == "loads":
            return "loads:" + ",".join(repr(x) for x in self.loads)
        return "balanced"

    def as_meta(self) -> dict:
        """The trace meta's `routing` object."""
        out: dict = {"kind": self.kind}
        if self.kind == "zipf":
            out["exponent"] = self.exponent
        if self.kind == "loads":
            out["loads"] = list(self.loads)
            if self.source:
                out["source"] = self.source
        return out

    def shares(self, experts: int) -> list[float]:
        """The fraction of all picks each of `experts` experts gets (sums to 1)."""
        if experts < 1:
            raise RoutingError(f"a router over {experts} experts")
        if self.kind == "zipf":
            w = [1.0 / (e + 1) ** self.exponent for e in range(experts)]
        elif self.kind == "loads":
            if len(self.loads) != experts:
                src = f" in {self.source}" if self.source else ""
                raise RoutingError(f"{OPTION}: {len(self.loads)} expert loads were given{src}, but the model routes "
                                   f"over {experts} experts: give one load per expert")
            w = list(self.loads)
        else:
            w = [1.0] * experts
        total = sum(w)
        return [x / total for x in w]


BALANCED = RoutingSpec()
_NUMBER_SEP = re.compile(r"[\s,]+")


def _numbers(text: str, where: str) -> tuple[float, ...]:
    out = []
    for tok in _NUMBER_SEP.split(text.strip()):
        if not tok:
            continue
        try:
            x = float(tok)
        except ValueError:
            raise RoutingError(f"{OPTION}: {where}: '{tok}' is not a number") from None
        if not math.isfinite(x) or x < 0:
            raise RoutingError(f"{OPTION}: {where}: loads must be finite and non-negative, got {tok}")
        out.append(x)
    if not out:
        raise RoutingError(f"{OPTION}: {where}: no expert loads")
    if sum(out) <= 0:
        raise RoutingError(f"{OPTION}: {where}: the loads are all zero")
    return tuple(out)


def parse(text: str, *, base: Path | None = None) -> RoutingSpec:
    """A routing distribution from `balanced`, `zipf:S`, `loads:L0,L1,...` or `file:PATH` (the command line's form;
    the file holds numbers separated by white space or commas, `#` starting a comment). Errors name the option."""
    raw = (text or "").strip()
    kind, _, value = raw.partition(":")
    kind = kind.strip().lower()
    if kind == "balanced" and not value:
        return BALANCED
    if kind == "zipf":
        try:
            s = float(value)
        except ValueError:
            raise RoutingError(f"{OPTION} {raw}: the Zipf exponent must be a number, e.g. zipf:1.2") from None
        if not math.isfinite(s) or s <= 0:
            raise RoutingError(f"{OPTION} {raw}: the Zipf exponent must be positive and finite "
                               f"(balanced is the uniform split)")
        return RoutingSpec("zipf", exponent=s)
    if kind == "loads":
        return RoutingSpec("loads", loads=_numbers(value, raw))
    if kind == "file":
        path = Path(value.strip())
        if base is not None and not path.is_absolute():
            path = base / path
        try:
            body = path.read_text()
        except OSError as exc:
            raise RoutingError(f"{OPTION} {raw}: cannot read {path}: {exc.strerror or exc}") from None
        body = "\n".join(line.split("#", 1)[0] for line in body.splitlines())
        return RoutingSpec("loads", loads=_numbers(body, str(path)), source=path.name)
    raise RoutingError(f"{OPTION} {raw!r}: expected balanced, zipf:S (S > 0), loads:L0,L1,... or file:PATH")


def expert_counts(spec: RoutingSpec, tokens: int, top_k: int, experts: int) -> list[int]:
    """Tokens each expert receives when `tokens` tokens each pick `top_k` distinct experts of `experts`."""
    if tokens < 0 or not 0 < top_k <= experts:
        raise RoutingError(f"cannot route {tokens} tokens to {top_k} of {experts} experts")
    picks = tokens * top_k
    shares = spec.shares(experts)
    # water-filling: an expert cannot take more than every token; its excess goes to the others by their shares
    ideal = [0.0] * experts
    open_ = set(range(experts))
    left = float(picks)
    while open_:
        weight = sum(shares[e] for e in open_)
        if weight <= 0:
            break
        capped = [e for e in open_ if left * shares[e] / weight > tokens]
        if not capped:
            for e in open_:
                ideal[e] = left * shares[e] / weight
            break
        for e in capped:
            ideal[e] = float(tokens)
            left -= tokens
            open_.discard(e)
    counts = [min(tokens, math.floor(x + 1e-9)) for x in ideal]
    short = picks - sum(counts)
    order = sorted(range(experts), key=lambda e: (-(ideal[e] - counts[e]), e))
    while short > 0:                      # one more pick each, largest remainder first (ties: lower expert)
        for e in order:
            if short <= 0:
                break
            if counts[e] < tokens:
                counts[e] += 1
                short -= 1
    return counts


def describe(meta: dict | None) -> str:
    """A trace meta's `routing` object in words (`""` for a trace without one: written before routing was
    recorded)."""
    if not meta:
        return ""
    kind = meta.get("kind", "balanced")
    if kind == "zipf":
        return f"zipf:{meta.get('exponent')} (expert e gets a share proportional to 1/(e+1)^{meta.get('exponent')})"
    if kind == "loads":
        loads = meta.get("loads") or []
        src = f" from {meta['source']}" if meta.get("source") else ""
        return f"per-expert loads{src} ({len(loads)} experts)"
    return "balanced (every expert the same share)"


def skewed(meta: dict | None) -> bool:
    """Whether a trace meta's `routing` is anything but the default balanced split (worth a line in a report)."""
    return bool(meta) and meta.get("kind", "balanced") != "balanced"
