"""Phantora: a hybrid GPU-cluster simulator.

Unmodified PyTorch training scripts run on one ordinary machine while every GPU kernel and collective is costed
and simulated on per-rank virtual clocks of a virtual cluster described by presets.
"""

__version__ = "0.1.0"
