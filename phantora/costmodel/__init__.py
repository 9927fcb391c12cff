"""Kernel cost model: the duration, FLOPs and bytes of one kernel signature on one GPU model.

Sources, in order: a measured profile database of the GPU (`ProfileDB`), live measurement on a local CUDA GPU
(`measure`), another GPU's profile scaled across GPUs, and a roofline model with per-family efficiencies
(`RooflineModel`). `CostModel` ties them together; docs/cost-model.md describes formulas, tables and file format.
The programs that measure profiles and fit the tables (`phantora profile`, the calibration set, the power probe)
are in phantora/probes/, which nothing here imports.
"""

from .cost import Cost
from .families import Work, classify, work
from .model import CostModel
from .profiledb import ProfileDB, ProfileDBError, ProfileRecord
from .roofline import EfficiencyTable, FamilyEfficiency, RooflineModel, default_table, fit_efficiencies
from .signature import Signature, signature_of

__all__ = ["Cost", "CostModel", "EfficiencyTable", "FamilyEfficiency", "ProfileDB", "ProfileDBError",
           "ProfileRecord", "RooflineModel", "Signature", "Work", "classify", "default_table", "fit_efficiencies",
           "signature_of", "work"]
