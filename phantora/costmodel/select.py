"""Which measured profiles a cost model uses for a GPU, by default.

- the GPU's own profile database, `presets/profiles/<gpu preset>.h5`, when one was measured (or an explicit path),
  and for the signatures it lacks, the profile of another measured GPU of the same architecture scaled by the two
  GPUs' roofline ratio (an H200's from the H100's and the other way round);
- otherwise, as the cross-GPU fallback, the profile of a measured GPU of the same architecture, the one with the
  closest memory bandwidth (an H100 96 GB HBM2e is costed from the H100 SXM 80 GB profile, an H200 NVL from the
  H200 SXM's, scaled by the two GPUs' roofline ratio), or of any measured GPU
  when none of its architecture was measured (an A100 from the H100's profile, each with its architecture's fitted
  efficiencies); roofline estimates remain for signatures no profile has.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..errors import PhantoraError
from ..gpus import GPUSpec, load_gpu
from ..paths import presets_dir
from .model import CostModel
from .profiledb import ProfileDB


def profiles_dir() -> Path:
    return presets_dir() / "profiles"


def measured_gpus() -> list[str]:
    """GPU presets with a shipped profile database."""
    return sorted(p.stem for p in profiles_dir().glob("*.h5"))


def fallback_gpu(gpu: GPUSpec) -> str | None:
    """The measured GPU whose profile stands in for `gpu` (None when `gpu` has its own)."""
    measured = measured_gpus()
    if gpu.name in measured or not measured:
        return None
    return same_arch_peer(gpu) or measured[0]


def same_arch_peer(gpu: GPUSpec) -> str | None:
    """Another measured GPU of `gpu`'s architecture, the one closest in memory bandwidth (HBM3e stands in for
    HBM3e, HBM3 for HBM2e); None if there is none."""
    peers = [m for m in measured_gpus() if m != gpu.name and load_gpu(m).arch.lower() == gpu.arch.lower()]
    if not peers:
        return None
    return min(peers, key=lambda m: abs(math.log(load_gpu(m).hbm_bandwidth_gbyte_per_s
                                                 / gpu.hbm_bandwidth_gbyte_per_s)))


def default_cost_model(gpu: GPUSpec, profile: str | Path | None = None, **kwargs) -> CostModel:
    """A CostModel for `gpu` with its own profile (or `profile`) and, failing that, a cross-GPU fallback."""
    if profile and not Path(profile).exists():
        raise PhantoraError(f"profile database {profile} does not exist")
    own = Path(profile) if profile else profiles_dir() / f"{gpu.name}.h5"
    if own.exists():
        # signatures the GPU's own database lacks come from a measured GPU of its architecture, scaled across
        # (an H200's from the H100's and the other way round), before the roofline model
        db = ProfileDB.open(own)
        if profile and db.gpu != gpu.name:
            raise PhantoraError(f"profile database {profile} was measured on '{db.gpu}', and the run is costed on "
                                f"'{gpu.name}': name that GPU as well (--gpu {db.gpu}), or leave --profile out to "
                                f"cost '{gpu.name}' from its own measurements")
        peer = same_arch_peer(gpu)
        if peer is None:
            return CostModel(gpu, profile_db=db, **kwargs)
        return CostModel(gpu, profile_db=db, fallback_gpu_db=ProfileDB.open(profiles_dir() / f"{peer}.h5"),
                         **kwargs)
    other = fallback_gpu(gpu)
    if other is None:
        return CostModel(gpu, **kwargs)
    return CostModel(gpu, fallback_gpu_db=ProfileDB.open(profiles_dir() / f"{other}.h5"), **kwargs)
