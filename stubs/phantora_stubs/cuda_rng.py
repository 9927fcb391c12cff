"""`torch.cuda` RNG state: one generator per device in `torch.cuda.default_generators`, the torch.cuda RNG
functions that go through them, and `torch.Generator(device="cuda")`.

Each generator keeps seed and offset; its state is the 16-byte tensor of a CUDA generator. The fake CUDA hooks answer
a new CUDA generator with a CPU one (`.device` cpu), so `torch.Generator` is replaced by a stand-in class whose
construction for a CUDA device gives a `CudaGenerator` and for any other device torch's own generator;
`isinstance(g, torch.Generator)` holds for every generator, as before.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import random
import struct
import weakref
from typing import Any

import torch

from .clock import unmetered
from .cuda_device import _check_index, _ctx, _index, current_device, device_count, get_device_properties


# ---- RNG -------------------------------------------------------------------------------------------------------------

DEFAULT_SEED = 67280421310721          # PyTorch's default_rng_seed_val


class CudaGenerator(torch.Generator):
    """A CUDA generator of the simulated device (one per device in `torch.cuda.default_generators`).

    Its state is what PyTorch's CUDA (Philox) generator keeps, the seed and the offset, and `get_state()` is the same
    16-byte uint8 tensor (seed, offset as little-endian 64-bit integers). `graphsafe_get_state()` / `clone_state()`
    return a generator holding a copy of the state, `graphsafe_set_state()` takes one back. A random kernel advances
    the offset as PyTorch's distribution kernels do (`draw_generator`). The object is a `torch.Generator`, so it can
    be passed as `generator=` to random ops (their fake kernels ignore it)."""

    def __new__(cls, device: Any = None):
        self = super().__new__(cls, device="cpu")
        return self

    def __init__(self, device: Any = None):
        self._index = _index(device)
        self._seed = DEFAULT_SEED
        self._offset = 0
        _mark(self)

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self._index)

    def get_state(self) -> torch.Tensor:
        return _real_byte_tensor(struct.pack("<Qq", self._seed & (2**64 - 1), self._offset))

    def set_state(self, new_state: torch.Tensor) -> "CudaGenerator":
        raw = _state_bytes(new_state)
        if raw is not None:
            if len(raw) != 16:
                raise RuntimeError(f"RNG state is wrong size: expected 16 bytes, got {len(raw)}")
            self._seed, self._offset = struct.unpack("<Qq", raw)
        return self

    def manual_seed(self, seed: int) -> "CudaGenerator":
        self._seed = int(seed) & (2**64 - 1)
        self._offset = 0
        return self

    def seed(self) -> int:
        self.manual_seed(random.getrandbits(63))
        return self._seed

    def initial_seed(self) -> int:
        return self._seed

    def get_offset(self) -> int:
        return self._offset

    def set_offset(self, offset: int) -> "CudaGenerator":
        self._offset = int(offset)
        return self

    def clone_state(self) -> "CudaGenerator":
        g = CudaGenerator(self._index)
        g._seed, g._offset = self._seed, self._offset
        return g

    graphsafe_get_state = clone_state

    def graphsafe_set_state(self, state: "CudaGenerator") -> "CudaGenerator":
        if not isinstance(state, CudaGenerator):
            raise RuntimeError("graphsafe_set_state expects the state of a CUDA generator")
        self._seed, self._offset = state._seed, state._offset
        return self

    def __getstate__(self):
        return {"index": self._index, "seed": self._seed, "offset": self._offset}

    def __setstate__(self, st):
        self._index, self._seed, self._offset = st["index"], st["seed"], st["offset"]
        _mark(self)

    def __reduce__(self):
        return (CudaGenerator, (self._index,), self.__getstate__())

    def __repr__(self) -> str:
        return f"<torch._C.Generator object (cuda:{self._index}) at {id(self):#x}>"


# A generator reaches an op's kernel through C++, which hands the dispatch mode a new Python object of the same
# C++ generator, a CPU one: the CudaGenerator's own attributes are gone. Its C++ seed, which the program never sets
# (CudaGenerator keeps the seed it is given in Python), names it instead: a mark and a serial number.
_MARK_BASE = 0x5048414E << 32            # "PHAN" above a 32-bit serial number
_BY_SERIAL: "weakref.WeakValueDictionary[int, CudaGenerator]" = weakref.WeakValueDictionary()
_SERIALS = itertools.count(1)


def _mark(gen: "CudaGenerator") -> None:
    serial = next(_SERIALS) & 0xFFFFFFFF
    _BY_SERIAL[serial] = gen
    _TorchGenerator.manual_seed(gen, _MARK_BASE + serial)


def _simulated_cuda(gen: Any) -> "CudaGenerator | None":
    """The simulated CUDA generator that `gen` (as an op's kernel received it) is, or None."""
    try:
        seed = _TorchGenerator.initial_seed(gen)
    except (TypeError, RuntimeError):
        return None
    if seed >> 32 != _MARK_BASE >> 32:
        return None
    return _BY_SERIAL.get(seed & 0xFFFFFFFF)


def generator_device_type(gen: Any) -> str | None:
    """The device type of the generator an op's kernel received: "cuda" for a simulated CUDA generator (its C++ seed
    carries the mark), else the generator's own device type."""
    if _simulated_cuda(gen) is not None:
        return "cuda"
    return getattr(getattr(gen, "device", None), "type", None)


# PyTorch's distribution and dropout kernels (ATen/native/cuda/DistributionTemplates.h calc_execution_policy,
# Dropout.cu): blocks of 256 threads, at most as many as the SMs hold resident, each thread drawing 4 numbers per
# Philox call (curand4_engine_calls) for `unroll` elements.
_BLOCK, _UNROLL = 256, 4


def philox_increment(numel: int, sms: int, threads_per_sm: int) -> int:
    """How far one random kernel over `numel` elements advances its generator's offset: ((numel - 1) / (block x
    grid x 4) + 1) x 4, grid = min(SMs x resident blocks per SM, ceil(numel / block)); 0 for an empty tensor."""
    if numel <= 0:
        return 0
    grid = max(1, min(sms * (threads_per_sm // _BLOCK), -(-numel // _BLOCK)))
    return ((numel - 1) // (_BLOCK * grid * _UNROLL) + 1) * _UNROLL


@contextlib.contextmanager
def host_draws(gen: torch.Generator):
    """Within: the host's default generator draws as `gen` (the ops that take no generator draw from it), then
    returns to its own state."""
    default = torch.default_generator
    if gen is default:
        yield
        return
    saved = default.get_state()
    default.set_state(gen.get_state())
    try:
        yield
    finally:
        default.set_state(saved)


def draw_generator(gen: Any, device: int, numel: int) -> torch.Generator:
    """A random kernel of `numel` elements on CUDA device `device`, given `gen` (None: the device's default generator):
    its generator's offset advances as PyTorch's kernel advances it, and the returned host generator, seeded from the
    generator's seed and offset before the kernel, draws the values a small random tensor is given (values.py). The
    numbers are not Philox's; what holds as on a GPU is that reseeding (`torch.cuda.manual_seed`) or restoring a state
    draws the same numbers again, and that the host's generator is not used."""
    cuda_gen = _simulated_cuda(gen) if gen is not None else _generators()[device]
    if cuda_gen is None:                     # another kind of generator: its own draws
        return gen
    host = _TorchGenerator()
    props = get_device_properties(cuda_gen._index)
    seed, offset = cuda_gen._seed, cuda_gen._offset
    host.manual_seed((seed * 0x9E3779B97F4A7C15 + offset) & (2**63 - 1))
    cuda_gen._offset = offset + philox_increment(numel, props.multi_processor_count,
                                                 props.max_threads_per_multi_processor)
    return host


def _state_bytes(new_state: Any) -> bytes | None:
    """The bytes of a uint8 state tensor: a real one, or a fake one whose value the host knows (a state from
    get_state() that the program cloned or copied; values.py); None for a fake one without a value."""
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    from .values import VALUES
    if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8:
        raise TypeError("RNG state must be a torch.ByteTensor")
    if isinstance(new_state, FakeTensor):
        new_state = VALUES.get(new_state)
        if new_state is None:
            return None
    with unset_fake_temporarily():
        return bytes(new_state.detach().cpu().reshape(-1).tolist())


def _real_byte_tensor(data: bytes) -> torch.Tensor:
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily():
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def _generators() -> tuple:
    """The generators of the devices this process sees (`torch.cuda.default_generators`)."""
    device_count()                     # CUDA_VISIBLE_DEVICES read (cuda_device.visible), the tuple cut to it
    return all_generators()


def all_generators() -> tuple:
    """One generator per GPU of the simulated host, made when torch.cuda is installed (`default_generators`
    before CUDA_VISIBLE_DEVICES is read, which waits for the program's first use of CUDA)."""
    gens = _ctx().extras.get("cuda_generators")
    if gens is None:
        gens = _ctx().extras["cuda_generators"] = tuple(CudaGenerator(i) for i in range(_ctx().dev.device_count))
        install_generator_class()
    return gens


def show_generators(count: int) -> None:
    """Keep the generators of the first `count` devices, the ones the process sees."""
    gens = all_generators()[:count]
    _ctx().extras["cuda_generators"] = gens
    torch.cuda.default_generators = gens


# ---- torch.Generator -------------------------------------------------------------------------------------------------

_TorchGenerator = torch._C.Generator


def _new_generator(device: Any = None) -> torch.Generator:
    """`torch.Generator(device)` as a CUDA build constructs it (THPGenerator_pynew): a CUDA device gets a new CUDA
    generator of that device, the current one for "cuda" (createCUDAGenerator: seed default_rng_seed_val, offset 0,
    "The device_index is invalid." for a device the host lacks); every other device torch's own generator."""
    if device is None:
        return _TorchGenerator()
    dev = device
    if isinstance(dev, int) and not isinstance(dev, bool):
        dev = torch.device("cuda", dev)          # an integer names a device of the accelerator (CUDA)
    elif isinstance(dev, str):
        dev = torch.device(dev)
    if not (isinstance(dev, torch.device) and dev.type == "cuda"):
        return _TorchGenerator(device)
    idx = current_device() if dev.index is None else dev.index
    if not 0 <= idx < device_count():
        raise RuntimeError("The device_index is invalid.")
    return CudaGenerator(idx)


class _GeneratorMeta(type(_TorchGenerator)):
    """Metaclass of the `torch.Generator` stand-in: calling the class constructs as `_new_generator` does, and every
    torch generator (the CPU default generator, a CudaGenerator) is an instance of it.

    The instance and subclass checks are torch's own C checks against `torch._C.Generator` (bound with
    `functools.partial`, no Python frame): `isinstance(x, torch.Generator)`, which PyTorch's Python runs on many
    ops, is a C check in a real run and must not count as the framework's host work (docs/host-cpu.md). A
    program's subclass of torch.Generator answers them as torch.Generator does."""

    @unmetered                                 # C++ in a real run (THPGenerator_pynew): not the framework's work
    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is not Generator:               # a program's subclass of torch.Generator: constructed as usual
            return super().__call__(*args, **kwargs)
        return _new_generator(*args, **kwargs)

    __instancecheck__ = staticmethod(functools.partial(type.__instancecheck__, _TorchGenerator))
    __subclasscheck__ = staticmethod(functools.partial(type.__subclasscheck__, _TorchGenerator))


class Generator(_TorchGenerator, metaclass=_GeneratorMeta):
    __doc__ = _TorchGenerator.__doc__


Generator.__module__ = "torch"
Generator.__qualname__ = Generator.__name__ = "Generator"


def install_generator_class() -> None:
    """`torch.Generator` becomes the stand-in (idempotent); `torch._C.Generator` stays torch's."""
    if torch.Generator is not Generator:
        torch.Generator = Generator


def _generator(device: Any = "cuda") -> CudaGenerator:
    idx = _index(device)
    _check_index(idx)
    return _generators()[idx]


def get_rng_state(device: Any = "cuda") -> torch.Tensor:
    return _generator(device).get_state()


def get_rng_state_all() -> list[torch.Tensor]:
    return [g.get_state() for g in _generators()]


def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
    _generator(device).set_state(new_state)


def set_rng_state_all(new_states: Any) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def manual_seed(seed: int) -> None:
    _generator(current_device()).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for g in _generators():
        g.manual_seed(int(seed))


def seed() -> None:
    _generator(current_device()).seed()


def seed_all() -> None:
    s = random.getrandbits(63)
    for g in _generators():
        g.manual_seed(s)


def initial_seed() -> int:
    return _generator(current_device()).initial_seed()
