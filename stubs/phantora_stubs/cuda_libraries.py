"""The CUDA libraries torch.cuda reaches: NVML queries (failing as without nvidia-ml-py), `torch.cuda.cudart()`,
TunableOp's switches and the cuBLAS handle."""

from __future__ import annotations

from typing import Any

from .cuda_device import current_device


# ---- NVML, cudart, TunableOp, cuBLAS -------------------------------------------------------------------------------

def _nvml_missing(*args: Any, **kwargs: Any):
    """NVML queries (utilization, temperature, power draw, clock rate, memory usage, device memory used): the
    simulated GPU has no NVML, so they fail as torch's do on a machine without nvidia-ml-py."""
    raise ModuleNotFoundError("nvidia-ml-py does not seem to be installed or it can't be imported.")


class _CudaRuntime:
    """`torch.cuda.cudart()`: the CUDA runtime calls scripts make through it (profiler ranges for nsys, host
    registration), each answering cudaSuccess."""

    class cudaError:
        success = 0

    @staticmethod
    def cudaProfilerStart() -> int:
        return 0

    @staticmethod
    def cudaProfilerStop() -> int:
        return 0

    @staticmethod
    def cudaHostRegister(ptr: int, size: int, flags: int) -> int:
        return 0

    @staticmethod
    def cudaHostUnregister(ptr: int) -> int:
        return 0

    @staticmethod
    def cudaGetErrorString(err: int) -> str:
        return "no error" if err == 0 else f"CUDA error {err}"


_TUNABLE = {"enabled": False, "tuning": False, "record_untuned": False}


def _tunable_functions() -> dict[str, Any]:
    """TunableOp's switches (off, as on a CUDA build without PYTORCH_TUNABLEOP_ENABLED); kernels are costed the
    same either way."""

    def _cuda_tunableop_enable(val: bool = True) -> None:
        _TUNABLE["enabled"] = bool(val)

    def _cuda_tunableop_is_enabled() -> bool:
        return _TUNABLE["enabled"]

    def _cuda_tunableop_tuning_enable(val: bool = True) -> None:
        _TUNABLE["tuning"] = bool(val)

    def _cuda_tunableop_tuning_is_enabled() -> bool:
        return _TUNABLE["tuning"]

    def _cuda_tunableop_record_untuned_enable(val: bool = True) -> None:
        _TUNABLE["record_untuned"] = bool(val)

    def _cuda_tunableop_record_untuned_is_enabled() -> bool:
        return _TUNABLE["record_untuned"]

    return {f.__name__: f for f in (_cuda_tunableop_enable, _cuda_tunableop_is_enabled,
                                    _cuda_tunableop_tuning_enable, _cuda_tunableop_tuning_is_enabled,
                                    _cuda_tunableop_record_untuned_enable,
                                    _cuda_tunableop_record_untuned_is_enabled)}


def current_blas_handle() -> int:
    """A cuBLAS handle is an opaque pointer: a stable nonzero value per device."""
    return 0x7F0000001000 + (current_device() << 12)
