"""The software versions a CUDA build of torch reports (CUDA, cuDNN, NCCL), installed on a CPU-only torch
(`_install_versions`), and the convolution layout its cuDNN gives (`cudnn_conv_memory_format`); torch.cuda.nccl's
single-process multi-GPU calls are unsupported."""

from __future__ import annotations

from typing import Any

from .errors import UnsupportedOpError, user_location


# ---- software versions ---------------------------------------------------------------------------------------------
# What a CPU-only torch lacks, answered as the CUDA build of the release the project measures on its H100s does:
# torch 2.11.0 from PyPI, built with CUDA 13.0 and pinned to cuDNN 9.19.0 and NCCL 2.28.9 (its wheel's requirements;
# the NCCL version is also what groundtruth/nccl/ recorded). A CUDA build of torch answers with its own.
CUDA_VERSION = "13.0"
CUDA_COMPILED_VERSION = 13000          # CUDA_VERSION macro: major * 1000 + minor * 10
CUDNN_VERSION = 91900                  # cuDNN 9.19.0: major * 10000 + minor * 100 + patch
NCCL_VERSION = (2, 28, 9)


def nccl_version_code() -> int:
    """`torch._C._nccl_version()`: major << 32 | minor << 16 | patch, as torch.cuda.nccl.version() decodes it."""
    major, minor, patch = NCCL_VERSION
    return (major << 32) | (minor << 16) | patch


def _nccl_unsupported(name: str):
    def call(*args: Any, **kwargs: Any):
        raise UnsupportedOpError(f"phantora does not simulate torch.cuda.nccl.{name} (single-process multi-GPU "
                                 f"NCCL, called at {user_location(2)}); use torch.distributed collectives")
    call.__name__ = f"_nccl_{name}"
    return call


def show_config() -> str:
    """`torch.__config__.show()` as the emulated CUDA build prints it: the CPU-only build's own asks the CUDA hooks
    for their part and fails ("Cannot query detailed CUDA version without ATen_cuda library"); libraries read it
    (torch_geometric looks for USE_MKL=OFF)."""
    import torch
    major, minor, patch = CUDNN_VERSION // 10000, CUDNN_VERSION // 100 % 100, CUDNN_VERSION % 100
    capability = torch.backends.cpu.get_cpu_capability()
    return ("PyTorch built with:\n"
            f"  - CPU capability usage: {capability}\n"
            f"  - CUDA Runtime {CUDA_VERSION}\n"
            f"  - CuDNN {major}.{minor}.{patch}\n"
            f"  - Build settings: BUILD_TYPE=Release, CUDA_VERSION={CUDA_VERSION}, "
            f"CUDNN_VERSION={major}.{minor}.{patch}, TORCH_VERSION={torch.__version__.split('+')[0]}, USE_CUDA=ON, "
            "USE_CUDNN=ON, USE_MKL=ON, USE_MKLDNN=ON, USE_MPI=OFF, USE_NCCL=ON, USE_NNPACK=ON, USE_OPENMP=ON, \n")


def _install_versions(ctx) -> None:
    """Versions and availability a CUDA build reports, where the installed torch lacks them."""
    import torch.backends.cuda as backends_cuda
    import torch.backends.cudnn as cudnn
    import torch.cuda.nccl as nccl
    import torch.version

    if torch.version.cuda is not None and getattr(torch._C, "_has_cuda", False):
        return                       # a CUDA build: its own versions are the real ones
    torch.version.cuda = CUDA_VERSION
    backends_cuda.is_built = lambda: True
    torch._C._cuda_getCompiledVersion = lambda: CUDA_COMPILED_VERSION

    def _nccl_version() -> int:
        return nccl_version_code()

    def _nccl_version_suffix() -> bytes:
        return b""

    torch._C._nccl_version = _nccl_version
    torch._C._nccl_version_suffix = _nccl_version_suffix
    for name in ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "init_rank", "unique_id"):
        if not hasattr(torch._C, f"_nccl_{name}"):
            setattr(torch._C, f"_nccl_{name}", _nccl_unsupported(name))
    del nccl

    def version() -> int:
        return CUDNN_VERSION

    def is_available() -> bool:
        return True

    def is_acceptable(tensor: torch.Tensor) -> bool:
        if not torch._C._get_cudnn_enabled():
            return False
        return tensor.device.type == "cuda" and tensor.dtype in cudnn.CUDNN_TENSOR_DTYPES

    cudnn.version = version
    cudnn.is_available = is_available
    cudnn.is_acceptable = is_acceptable
    _install_conv_layout()
    torch._C._show_config = show_config


def cudnn_conv_memory_format(input, weight) -> Any:
    """The layout cuDNN gives a convolution's output and gradients on a CUDA build (ATen's
    `cudnn_conv_suggest_memory_format`): channels-last (3d for 5-d weights) when the input or the weight is stored
    so, contiguous otherwise and for fp64."""
    import torch

    if input.dtype == torch.float64 or weight.dtype == torch.float64:
        return torch.contiguous_format
    if weight.dim() == 4 and (_channels_last(input, torch.channels_last)
                              or _channels_last(weight, torch.channels_last)):
        return torch.channels_last
    if weight.dim() == 5 and (_channels_last(input, torch.channels_last_3d)
                              or _channels_last(weight, torch.channels_last_3d)):
        return torch.channels_last_3d
    return torch.contiguous_format


def _channels_last(t, fmt) -> bool:
    """`t.suggest_memory_format() == fmt`: stored channels-last, and not also plainly contiguous (one channel)."""
    import torch

    dims = 4 if fmt == torch.channels_last else 5
    return t.dim() == dims and t.is_contiguous(memory_format=fmt) and not t.is_contiguous()


def _install_conv_layout() -> None:
    """Fake tensors take a convolution's output layout from `torch._C._conv_determine_backend_memory_format` of the
    backend ATen selects; a CPU build selects no cuDNN, so a channels-last convolution's output came back
    contiguous and every later layer of a channels-last network ran (and was costed) as NCHW. For CUDA tensors
    with cuDNN enabled the layout is cuDNN's."""
    import torch

    original = getattr(torch._C, "_conv_determine_backend_memory_format", None)
    if original is None or getattr(original, "_phantora", False):
        return

    def determine(input, weight, backend):
        if input.device.type == "cuda" and torch._C._get_cudnn_enabled():
            return cudnn_conv_memory_format(input, weight)
        return original(input, weight, backend)

    determine._phantora = True
    determine.__name__ = "_conv_determine_backend_memory_format"
    torch._C._conv_determine_backend_memory_format = determine
