"""Builds (once per torch install) and loads the fake CUDA library (csrc/fake_cuda.cpp).

Nothing here imports torch: the library must be loaded before `import torch`, because torch reads its CUDA hooks
when it is imported. On a CUDA build of torch it is loaded too (unless PHANTORA_FAKE_CUDA=cpu-only): its hooks
then take precedence over the real ones and, once torch is imported, its guard replaces the real CUDA guard.
The torch package is located with `importlib.util.find_spec`.

The shared object is cached under `$XDG_CACHE_HOME/phantora` (or `~/.cache/phantora`), named by a key made of the
torch version, the torch directory, the C++ ABI flag and the hash of the source, so a torch upgrade or a change to
the source builds a new one. The compiler writes to a temporary name which is then renamed into place, so rank
processes that start together never load a half-written file.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .errors import StubBuildError

SOURCE = Path(__file__).resolve().parent / "csrc" / "fake_cuda.cpp"


@dataclass(frozen=True)
class TorchInstall:
    """Where the torch package lives and what kind of build it is, found without importing it."""

    root: Path          # the torch package directory
    version: str        # torch.__version__, read from torch/version.py
    cuda_build: bool    # torch/lib/libtorch_cuda.so exists

    @property
    def include_dir(self) -> Path:
        return self.root / "include"

    @property
    def lib_dir(self) -> Path:
        return self.root / "lib"


def find_torch() -> TorchInstall:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise StubBuildError("torch is not installed in this Python environment (phantora needs PyTorch)")
    root = Path(list(spec.submodule_search_locations)[0]).resolve()
    version = "unknown"
    vfile = root / "version.py"
    if vfile.exists():
        m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", vfile.read_text(), re.M)
        if m:
            version = m.group(1)
    return TorchInstall(root=root, version=version, cuda_build=(root / "lib" / "libtorch_cuda.so").exists())


def _cxx11_abi(lib_dir: Path) -> int:
    """1 if libc10 was built with the C++11 std::string ABI (its symbols then mention `__cxx11`)."""
    lib = lib_dir / "libc10.so"
    try:
        return 1 if b"__cxx11" in lib.read_bytes() else 0
    except OSError:
        return 1


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "phantora"


def find_compiler() -> str:
    for cand in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if cand and shutil.which(cand):
            return shutil.which(cand)  # type: ignore[return-value]
    raise StubBuildError(
        "phantora needs a C++ compiler to build its fake CUDA device library, and none was found "
        "(looked for $CXX, g++, c++, clang++). Install one (e.g. `apt-get install g++`) or set CXX.")


# Only the library's C functions are exported. Loaded RTLD_GLOBAL before torch, any other symbol it defined (the
# C++ standard library's template instantiations: ostream insertion, codecvt, hash tables of c10's registries)
# would interpose on the copies libtorch was built with: a CUDA build of torch 2.11 crashed printing an operator
# schema at import. Hidden visibility, and a version script for the instantiations whose template arguments
# carry torch's default visibility.
VISIBILITY = ("-fvisibility=hidden", "-fvisibility-inlines-hidden", "-Wl,--exclude-libs,ALL")
VERSION_SCRIPT = "{ global: phantora_*; local: *; };\n"


def library_path(torch: TorchInstall) -> Path:
    abi = _cxx11_abi(torch.lib_dir)
    key = hashlib.sha256()
    for part in (torch.version, str(torch.root), f"abi{abi}", " ".join(VISIBILITY), VERSION_SCRIPT,
                 SOURCE.read_bytes().hex()):
        key.update(part.encode())
        key.update(b"\0")
    return cache_dir() / f"fake_cuda-{torch.version.replace('+', '_')}-{key.hexdigest()[:16]}.so"


def build(torch: TorchInstall, target: Path) -> Path:
    """Compile the fake CUDA library into `target` (atomically) and return it."""
    abi = _cxx11_abi(torch.lib_dir)
    return _compile(SOURCE, target, [
        *VISIBILITY, f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        "-I", str(torch.include_dir), "-I", str(torch.include_dir / "torch" / "csrc" / "api" / "include")],
        ["-L", str(torch.lib_dir), "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{torch.lib_dir}"], "the fake CUDA library")


def _compile(source: Path, target: Path, flags: list[str], libs: list[str], what: str) -> Path:
    """Compile `source` into the shared object `target`: written under a temporary name, then renamed into place,
    so rank processes that start together never load a half-written file."""
    cxx = find_compiler()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.stem + ".", suffix=".tmp.so", dir=target.parent)
    os.close(fd)
    fd, script = tempfile.mkstemp(prefix=target.stem + ".", suffix=".map", dir=target.parent)
    with os.fdopen(fd, "w") as f:
        f.write(VERSION_SCRIPT)
    cmd = [cxx, "-O2", "-shared", "-fPIC", "-std=c++17", *flags, f"-Wl,--version-script={script}", str(source),
           *libs, "-o", tmp]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise StubBuildError(
                f"building {what} failed ({' '.join(cmd[:1])} exited {proc.returncode}):\n{proc.stderr[-4000:]}")
        os.replace(tmp, target)
    finally:
        for path in (tmp, script):
            if os.path.exists(path):
                os.unlink(path)
    return target


HOST_COUNTER_SOURCE = SOURCE.parent / "host_counter.cpp"
_HOST_COUNTER: ctypes.CDLL | None = None


def host_counter() -> ctypes.CDLL:
    """The host-work counter library (csrc/host_counter.cpp), built once into the cache and loaded. Idempotent.

    It needs neither torch nor the Python headers, so it is keyed by its source alone."""
    global _HOST_COUNTER
    if _HOST_COUNTER is not None:
        return _HOST_COUNTER
    key = hashlib.sha256(HOST_COUNTER_SOURCE.read_bytes() + VERSION_SCRIPT.encode()).hexdigest()[:16]
    path = cache_dir() / f"host_counter-{key}.so"
    if not path.exists():
        _compile(HOST_COUNTER_SOURCE, path, ["-fvisibility=hidden"], ["-ldl"], "the host-work counter")
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise StubBuildError(f"could not load the host-work counter {path}: {exc}") from None
    lib.phantora_hc_counts.restype = ctypes.POINTER(ctypes.c_longlong)
    lib.phantora_hc_counts.argtypes = []
    lib.phantora_hc_skip_names.restype = ctypes.c_int
    lib.phantora_hc_skip_names.argtypes = [ctypes.c_long, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
    _HOST_COUNTER = lib
    return lib


_LOADED: ctypes.CDLL | None = None


def wanted(torch: TorchInstall) -> bool:
    """Whether this rank uses the fake CUDA library. PHANTORA_FAKE_CUDA=always (default): on every build of torch,
    so a rank never touches a real GPU and every simulated device index works; =cpu-only: only on CPU-only torch
    (a CUDA build then keeps its own device guard and hooks, and creates a CUDA context on the real GPU)."""
    mode = os.environ.get("PHANTORA_FAKE_CUDA", "always").strip().lower() or "always"
    if mode not in ("always", "cpu-only"):
        raise StubBuildError(f"PHANTORA_FAKE_CUDA={mode!r}: expected 'always' or 'cpu-only'")
    return not torch.cuda_build or mode == "always"


def ensure_fake_cuda() -> ctypes.CDLL | None:
    """Load the fake CUDA library (building it first if needed); None where it is not wanted (see `wanted`).

    Must run before `import torch`. Idempotent.
    """
    global _LOADED
    if _LOADED is not None:
        return _LOADED
    torch = find_torch()
    if not wanted(torch):
        return None
    path = library_path(torch)
    if not path.exists():
        build(torch, path)
    try:
        lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        raise StubBuildError(f"could not load the fake CUDA library {path}: {exc}") from None
    _declare(lib)
    _LOADED = lib
    return lib


def _declare(lib: ctypes.CDLL) -> None:
    lib.phantora_get_stream.restype = ctypes.c_longlong
    lib.phantora_get_stream.argtypes = [ctypes.c_int]
    lib.phantora_set_stream.argtypes = [ctypes.c_int, ctypes.c_longlong]
    lib.phantora_new_stream_id.restype = ctypes.c_longlong
    lib.phantora_set_device.argtypes = [ctypes.c_int]


def loaded() -> ctypes.CDLL | None:
    """The library if it was loaded in this process."""
    return _LOADED
