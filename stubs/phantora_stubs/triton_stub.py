"""A stand-in `triton` package for CPU-only torch, so that frameworks which import triton unconditionally load.

Installed only when triton is not installed. It answers imports of `triton` and `triton.*` from code outside torch
(torch itself keeps seeing no triton, so it never takes its triton code paths). Attribute access returns permissive
placeholders, decorators (`triton.jit`, `triton.autotune(...)`, `triton.heuristics(...)`) return kernel objects, and
`triton.cdiv` / `triton.next_power_of_2` compute. Launching a kernel (`kernel[grid](...)`) raises UnsupportedOpError:
user triton kernels are not simulated.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Any

STUB_VERSION = "3.0.0"


class _Kernel:
    def __init__(self, fn: Any):
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = getattr(fn, "__doc__", None)

    def __getitem__(self, grid: Any):
        def launch(*args: Any, **kwargs: Any):
            from .errors import UnsupportedOpError, user_location
            raise UnsupportedOpError(f"phantora does not simulate user triton kernels ({self.__name__} launched at "
                                     f"{user_location(2)})")
        return launch

    def __call__(self, *args: Any, **kwargs: Any):
        return self.fn(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return _Anything(f"{self.__name__}.{name}")


class _Anything:
    """Permissive placeholder: attribute access, calls, subscripts and subclassing all succeed."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs and not isinstance(args[0], _Anything):
            return _Kernel(args[0])
        return _Anything(f"{self._name}()")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Anything(f"{self._name}.{name}")

    def __getitem__(self, key: Any) -> Any:
        return _Anything(f"{self._name}[...]")

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)

    def __repr__(self) -> str:
        return f"<phantora triton stub {self._name}>"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


class _StubClass:
    """Base of the stand-in classes: any arguments accepted (`triton.Config({...}, num_warps=4)`), any attribute a
    placeholder."""
    __phantora_stub__ = True

    def __init__(self, *args: Any, **kwargs: Any):
        pass

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Anything(f"{type(self).__name__}.{name}")


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if name[:1].isupper():
            # A class name (triton.runtime.jit.JITFunction, triton.Config): a real, empty class, kept on the module,
            # so that isinstance() and subclassing work (torch's flop counter tests isinstance(x, JITFunction);
            # nothing is an instance of it, as no triton kernel exists here)
            cls = type(name, (_StubClass,), {"__module__": self.__name__})
            setattr(self, name, cls)
            return cls
        return _Anything(f"{self.__name__}.{name}")


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        mod = _StubModule(spec.name)
        mod.__path__ = []          # a package: submodules resolve through the finder
        return mod

    def exec_module(self, module):
        if module.__name__ == "triton":
            module.__version__ = STUB_VERSION
            module.jit = _Anything("triton.jit")
            module.cdiv = _cdiv
            module.next_power_of_2 = _next_power_of_2
            module.__phantora_stub__ = True


_TORCH_DIR: str | None = None
_IMPORTLIB_DIR = os.path.dirname(os.path.abspath(importlib.machinery.__file__))


def _importer_is_torch() -> bool:
    """Whether the innermost frame outside the import machinery belongs to torch."""
    frame = sys._getframe(1)
    stubs_dir = os.path.dirname(os.path.abspath(__file__)) + os.sep     # the stubs' own import hooks too
    while frame is not None:
        fn = frame.f_code.co_filename
        if fn.startswith("<") or fn.startswith(_IMPORTLIB_DIR) or os.path.abspath(fn).startswith(stubs_dir):
            frame = frame.f_back
            continue
        return _TORCH_DIR is not None and os.path.abspath(fn).startswith(_TORCH_DIR)
    return False


class TritonStubFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != "triton" and not fullname.startswith("triton."):
            return None
        root = sys.modules.get("triton")
        if fullname == "triton" and _importer_is_torch():
            return None
        if fullname != "triton" and not getattr(root, "__phantora_stub__", False):
            return None
        return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)


def install() -> bool:
    """Install the finder if triton is missing; returns whether it was installed."""
    global _TORCH_DIR
    import importlib.util

    if any(isinstance(f, TritonStubFinder) for f in sys.meta_path):
        return True
    if "triton" in sys.modules or importlib.util.find_spec("triton") is not None:
        return False
    import torch
    _TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    try:   # let torch memoise "no triton" before any stub can be imported
        from torch.utils import _triton
        _triton.has_triton_package()
        _triton.has_triton()
    except Exception:  # noqa: BLE001 - older/newer torch without these helpers
        pass
    sys.meta_path.append(TritonStubFinder())
    return True
