"""The GPU hosts the project's own ground truth was measured on, recognised from the `nvidia-smi` output a measuring
script saves (`system*.txt`): the record id prefix, the GPU and cluster presets that model them, and the host in
words. Used by the suites' `make_records.py` scripts (groundtruth/megatron/, groundtruth/deepspeed/)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class MeasuredHost:
    prefix: str             # record ids start with it
    gpu: str                # GPU preset
    cluster_1gpu: str       # cluster preset of a 1-GPU row
    cluster_2gpu: str       # cluster preset of a 2-GPU row ("" where the host has one GPU)
    words: str              # the host, in the records' notes

    def cluster(self, gpus: int) -> str:
        return self.cluster_2gpu if gpus == 2 else self.cluster_1gpu


HOSTS = {
    "NVIDIA H200": MeasuredHost("h200", "h200-sxm-141gb", "h200-1gpu", "h200-2gpu-nvlink",
                                "2 NVLinked H200 of one host"),
    "NVIDIA H100 80GB HBM3": MeasuredHost("h100", "h100-sxm-80gb", "h100-1gpu", "", "a one-H100 host"),
}
"""nvidia-smi's GPU name -> the host it was measured on."""


ONE_GPU_WORDS = {"NVIDIA H200": "a one-H200 host"}
"""A host type's words where its nvidia-smi listed one GPU (hosts of this type have one or two)."""


def host_of(folder: Path) -> MeasuredHost:
    """The host of a folder of measurements, from the first known GPU name in its system*.txt files (the first such
    file's count of that name's lines telling a one-GPU host from a two-GPU one)."""
    for path in sorted(Path(folder).glob("system*.txt")):
        names = [line.split(",")[0].strip() for line in path.read_text().splitlines()]
        known = [n for n in names if n in HOSTS]
        if known:
            host = HOSTS[known[0]]
            if known.count(known[0]) == 1 and known[0] in ONE_GPU_WORDS:
                host = MeasuredHost(host.prefix, host.gpu, host.cluster_1gpu, "", ONE_GPU_WORDS[known[0]])
            return host
    raise SystemExit(f"{folder}: no system*.txt naming a known GPU ({', '.join(HOSTS)})")


def cores_of(folder: Path) -> int | None:
    """The CPU cores of a folder's host: the first line of its system*.txt files that is a bare integer (`nproc`), or
    None where none is."""
    for path in sorted(Path(folder).glob("system*.txt")):
        for line in path.read_text().splitlines():
            if line.strip().isdigit():
                return int(line.strip())
    return None
