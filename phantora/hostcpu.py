"""The host-CPU model: what the framework's own work between two GPU ops costs the host, from counted work.

A rank's CPU clock advances, between two ops, by the framework's own host time. By default that time is *modelled*
(docs/host-cpu.md): the stubs count the host work the framework does between two ops — Python function calls,
built-in (C) function calls, Python lines run, and aten ops dispatched (kernels, views and metadata ops alike) — and
the host preset prices each (`[host]` of the cluster preset: `py_call_ns`, `c_call_ns`, `dispatch_us`, `py_line_ns`).
The counts are a function of the program alone, so the simulated time does not depend on the machine that simulates.
Each op carries its counts into the trace, and a replay prices them again under another host preset
(`phantora replay --set host.…`).

`measured` mode keeps the simulating machine's thread CPU time (times `cpu_time_scale`), for users who simulate on a
real training host (docs/host-cpu.md, "Calibration").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MODES = ("model", "measured")
DEFAULT_MODE = "model"
ENV_MODE = "PHANTORA_HOST_CPU"
"""Environment variable that tells a rank the mode (`model` or `measured`)."""
ENV_COSTS = "PHANTORA_HOST_COSTS"
"""Environment variable that tells a rank the prices: `py_call_ns,c_call_ns,dispatch_us,py_line_ns` (the last may
be left out: 0)."""


@dataclass(frozen=True)
class HostCosts:
    """Seconds of host time per unit of counted work."""

    py_call_s: float
    c_call_s: float
    dispatch_s: float
    py_line_s: float = 0.0

    @classmethod
    def from_spec(cls, host) -> "HostCosts":
        """From a cluster preset's `HostSpec`."""
        return cls(host.py_call_ns * 1e-9, host.c_call_ns * 1e-9, host.dispatch_us * 1e-6, host.py_line_ns * 1e-9)

    def seconds(self, py: int, c: int, disp: int, lines: int = 0) -> float:
        return py * self.py_call_s + c * self.c_call_s + disp * self.dispatch_s + lines * self.py_line_s

    def seconds_of(self, py: np.ndarray, c: np.ndarray, disp: np.ndarray,
                   lines: np.ndarray | None = None) -> np.ndarray:
        """`seconds` over columns (replay)."""
        out = (py.astype(np.float64) * self.py_call_s + c.astype(np.float64) * self.c_call_s
               + disp.astype(np.float64) * self.dispatch_s)
        if lines is not None:
            out += lines.astype(np.float64) * self.py_line_s
        return out

    def env(self) -> str:
        return f"{self.py_call_s * 1e9!r},{self.c_call_s * 1e9!r},{self.dispatch_s * 1e6!r},{self.py_line_s * 1e9!r}"

    @classmethod
    def parse_env(cls, text: str) -> "HostCosts":
        parts = [p.strip() for p in text.split(",")]
        if len(parts) not in (3, 4):
            raise ValueError(f"{ENV_COSTS}={text!r}: expected py_call_ns,c_call_ns,dispatch_us[,py_line_ns]")
        try:
            values = [float(p) for p in parts]
        except ValueError:
            raise ValueError(f"{ENV_COSTS}={text!r}: expected py_call_ns,c_call_ns,dispatch_us[,py_line_ns] as "
                             "numbers") from None
        for v in values:
            if not np.isfinite(v) or v < 0:
                raise ValueError(f"{ENV_COSTS}={text!r}: each price must be a finite number >= 0")
        py, c, d, line = (values + [0.0])[:4]
        return cls(py * 1e-9, c * 1e-9, d * 1e-6, line * 1e-9)

    def as_dict(self) -> dict:
        return {"py_call_ns": self.py_call_s * 1e9, "c_call_ns": self.c_call_s * 1e9,
                "dispatch_us": self.dispatch_s * 1e6, "py_line_ns": self.py_line_s * 1e9}


def check_mode(mode: str) -> str:
    mode = (mode or DEFAULT_MODE).strip().lower()
    if mode not in MODES:
        raise ValueError(f"host CPU mode {mode!r}: expected one of {', '.join(MODES)}")
    return mode


ENV_CONVERT = "PHANTORA_HOST_CONVERT"
"""Environment variable that tells a rank the conversion prices: `to_tensor_ns,infer_dtype_ns,to_list_ns`."""
CONVERT_KEYS = ("to_tensor_ns", "infer_dtype_ns", "to_list_ns")


@dataclass(frozen=True)
class ConvertCosts:
    """Seconds of host time per element converted between Python data and a tensor, work that one built-in call does
    in proportion to the data's size (docs/host-cpu.md, "Conversions"): `to_tensor_s` per element of a tensor built
    from a Python sequence or scalar (`torch.tensor`, `torch.as_tensor`, `torch.asarray`), `infer_dtype_s` more per
    element when no dtype is given (PyTorch walks the data once more to infer it), `to_list_s` per element of
    `Tensor.tolist()`."""

    to_tensor_s: float
    infer_dtype_s: float
    to_list_s: float

    @classmethod
    def from_spec(cls, host) -> "ConvertCosts":
        return cls(*(getattr(host, key) * 1e-9 for key in CONVERT_KEYS))

    def env(self) -> str:
        return ",".join(repr(v * 1e9) for v in (self.to_tensor_s, self.infer_dtype_s, self.to_list_s))

    @classmethod
    def parse_env(cls, text: str) -> "ConvertCosts":
        parts = [p.strip() for p in text.split(",")]
        if len(parts) != len(CONVERT_KEYS):
            raise ValueError(f"{ENV_CONVERT}={text!r}: expected {','.join(CONVERT_KEYS)}")
        try:
            values = [float(p) for p in parts]
        except ValueError:
            raise ValueError(f"{ENV_CONVERT}={text!r}: expected {','.join(CONVERT_KEYS)} as numbers") from None
        for v in values:
            if not np.isfinite(v) or v < 0:
                raise ValueError(f"{ENV_CONVERT}={text!r}: each price must be a finite number >= 0")
        return cls(*(v * 1e-9 for v in values))

    def as_dict(self) -> dict:
        return dict(zip(CONVERT_KEYS, (v * 1e9 for v in (self.to_tensor_s, self.infer_dtype_s, self.to_list_s))))
