"""Stand-ins for DeepSpeed's compiled ops, so that DeepSpeed's default choices run in a simulated rank.

On a GPU machine DeepSpeed compiles its CUDA and C++ extensions on first use (`OpBuilder.load()`: FusedAdam,
FusedLamb, the CPU optimizers of ZeRO-Offload, ZeRO++'s quantizer). A rank has no CUDA toolkit, and a compiled kernel
would run on tensors that hold no data, so `install()` (run once `deepspeed.ops.op_builder.builder` is imported; standins/__init__.py) makes
`OpBuilder.load()` return a stand-in module for the ops below. Each stand-in issues the torch ops that read and write
the same tensors as the kernel it replaces, so the cost model costs the same memory traffic:

| op (builder name) | DeepSpeed kernel | stand-in |
|---|---|---|
| fused_adam | `multi_tensor_adam` (g, p, m, v read; p, m, v written) | `torch._fused_adam_` / `torch._fused_adamw_` |
| fused_lamb | `lamb` (Adam's update plus the norms of p and of the update) | `torch._fused_adamw_` and `torch._foreach_norm` |
| cpu_adam, cpu_adagrad, cpu_lion | AVX loops over fp32 host tensors | host time from the host preset (`cpu_adam_gbps`) |
| quantizer: quantize, swizzle_quant | fp16 read; int8, fp32 group scales written | group inf-norm, cast to int8 |
| quantizer: dequantize | int8 values and scales read, fp16 written | `mul(out=fp16)` by the group's scale |
| quantizer: quantized_reduction | the node's int8 slices and scales read, one written | `sum(dtype=int8)`, `amax` |
| async_io | reads / writes of host buffers to swap files (NVMe offload) | storage time at `[host] storage_*_gbps` |
| pin_memory | page-locked host allocations | pinned host tensors |

(4 bits: two values a byte, packed by a `sum(dtype=int8)` of pairs, unpacked by a stride-0 broadcast of each byte.)

The CPU optimizers' tensors are fake host tensors; their step is charged to the rank's host clock: the bytes the loop
moves over the host preset's `cpu_adam_gbps` at the rank's threads (host_compute.py, docs/deepspeed.md). The quantizer
stands in for the four functions ZeRO++ calls, symmetric only; its other functions fail with an error naming them.
The async I/O handle touches no file: each request takes the host's storage time (`_Storage`), and `wait()` holds
the rank's host until the handle's requests are done (clock.host_wait_until).
Any other compiled op fails with an error naming it, rather than compiling.
"""

from __future__ import annotations

import enum
import types
from typing import Any

from . import kernels

# bytes each optimizer's host loop reads and writes per fp32 element: Adam p, g, m, v read and p, m, v written
# (7 x 4); Adagrad p, g, v read and p, v written (5 x 4); Lion p, g, m read and p, m written (5 x 4).
# FusedLion (GPU) has no stand-in: torch has no fused kernel of its traffic that runs on fake tensors.
HOST_BYTES_PER_ELEMENT = {"adam": 28, "adagrad": 20, "lion": 20}


class NoStandIn(RuntimeError):
    pass


def _fused_adam_module() -> types.ModuleType:
    mod = types.ModuleType("phantora_fused_adam")
    steps = kernels.StepTensors()

    def multi_tensor_adam(chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, eps, step, adam_w_mode,
                          bias_correction, weight_decay):
        g, p, m, v = tensor_lists
        kernels.fused_adam(p, g, m, v, steps, lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
                           adam_w_mode=bool(adam_w_mode))

    mod.multi_tensor_adam = multi_tensor_adam
    return mod


def _fused_lamb_module() -> types.ModuleType:
    import torch
    mod = types.ModuleType("phantora_fused_lamb")
    steps = kernels.StepTensors()

    def lamb(p, p_copy, m, v, g, lr, beta1, beta2, max_coeff, min_coeff, eps, grad_scale, step, eps_mode,
             bias_correction, decay):
        kernels.fused_adam([p], [g], [m], [v], steps, lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=decay,
                           adam_w_mode=True)
        norms = torch._foreach_norm([p, m])
        return norms[0] / norms[1]          # the trust ratio, a device scalar as the kernel returns

    mod.lamb = lamb
    return mod


def _cpu_optimizer_module(kind: str) -> types.ModuleType:
    """create_*/destroy_* bookkeeping and an update that charges the host time of the loop over the elements."""
    from .. import clock, host_compute
    mod = types.ModuleType(f"phantora_cpu_{kind}")
    per_element = HOST_BYTES_PER_ELEMENT[kind]
    memory = host_compute.memory()

    def update(opt_id, step, *rest):
        params = rest[-4] if kind == "adam" else rest[-3]
        clock.host_work(memory.seconds(per_element * params.numel(), "cpu_adam"))
        return 0

    def noop(*args, **kwargs):
        return 0

    setattr(mod, f"create_{kind}", noop)
    setattr(mod, f"destroy_{kind}", noop)
    setattr(mod, f"{kind}_update", update)
    setattr(mod, f"{kind}_rollback", update)
    return mod


class _Storage:
    """The rank's local storage as DeepSpeed's async I/O uses it: requests served one after another, each at the
    host preset's storage rate for the handle's I/O threads, from the later of its submission and the end of the
    one before (virtual host time)."""

    def __init__(self) -> None:
        self.free_at = 0.0

    def serve(self, nbytes: int, write: bool, threads: int, now: float) -> float:
        from .. import host_compute
        start = max(now, self.free_at)
        self.free_at = start + host_compute.memory().storage_seconds(nbytes, write, threads)
        return self.free_at


_STORAGE = _Storage()


class _PinnedHost:
    """Page-locked host buffers, as DeepSpeed's I/O and pin-memory handles hand them out: pinned fake host tensors."""

    def new_cpu_locked_tensor(self, num_elem, example_tensor):
        import torch
        return torch.empty(int(num_elem), dtype=example_tensor.dtype, device="cpu", pin_memory=True)

    def free_cpu_locked_tensor(self, tensor):
        return True

    def free_cpu_locked_tensor_by_ptr(self, address):
        return True

    def is_pinned(self, tensor):
        return bool(tensor.is_pinned())


def _async_io_module() -> types.ModuleType:
    """DeepSpeed's async I/O (`AsyncIOBuilder`, ZeRO-Infinity's NVMe offload of parameters and optimizer state): a
    handle whose reads and writes move no data (the tensors hold none) and take the storage's time; `wait()` holds
    the host until the handle's requests are done, as the real handle's does."""
    from .. import clock
    mod = types.ModuleType("phantora_async_io")

    class aio_handle(_PinnedHost):                           # noqa: N801 - DeepSpeed's name
        def __init__(self, block_size=1 << 20, queue_depth=128, single_submit=False, overlap_events=False,
                     intra_op_parallelism=1, *args, **kwargs):
            self._block_size, self._queue_depth = int(block_size), int(queue_depth)
            self._single_submit, self._overlap_events = bool(single_submit), bool(overlap_events)
            self._threads = max(1, int(intra_op_parallelism))
            self._pending, self._done_at = 0, 0.0

        def get_block_size(self):
            return self._block_size

        def get_queue_depth(self):
            return self._queue_depth

        def get_single_submit(self):
            return self._single_submit

        def get_overlap_events(self):
            return self._overlap_events

        def get_intra_op_parallelism(self):
            return self._threads

        get_thread_count = get_intra_op_parallelism

        def get_alignment(self):
            return self._threads * 512                    # the handle's O_DIRECT alignment, as DeepSpeed's C++


        def _submit(self, buffer, write: bool) -> int:
            nbytes = buffer.numel() * buffer.element_size()
            self._done_at = max(self._done_at, _STORAGE.serve(nbytes, write, self._threads, clock.host_now(3)))
            self._pending += 1
            return 0

        def async_pread(self, buffer, filename, file_offset=0):
            return self._submit(buffer, False)

        def async_pwrite(self, buffer, filename, file_offset=0):
            return self._submit(buffer, True)

        def pread(self, buffer, filename, validate=False, async_op=False, file_offset=0):
            self._submit(buffer, False)
            return 0 if async_op else self.wait()

        def pwrite(self, buffer, filename, validate=False, async_op=False, file_offset=0):
            self._submit(buffer, True)
            return 0 if async_op else self.wait()

        def sync_pread(self, buffer, filename, file_offset=0):
            self._submit(buffer, False)
            return self.wait()

        def sync_pwrite(self, buffer, filename, file_offset=0):
            self._submit(buffer, True)
            return self.wait()

        def wait(self):
            """The host waits for every request of the handle; returns how many completed."""
            done, self._pending = self._pending, 0
            clock.host_wait_until(self._done_at)
            return done

    mod.aio_handle = aio_handle
    return mod


def _pin_memory_module() -> types.ModuleType:
    """DeepSpeed's page-locked host allocator (`PinMemoryBuilder`: `AsyncIOBuilder.load()` loads it first, and
    `DS_PIN_MEMORY_BACKEND=native` pins through it): pinned host tensors."""
    mod = types.ModuleType("phantora_pin_memory")

    class pin_handle(_PinnedHost):                           # noqa: N801 - DeepSpeed's name
        pass

    mod.pin_handle = pin_handle
    return mod


class QuantizationType(enum.IntEnum):
    """The kernels' `quantize::Type` (exported by the extension as `QuantizationType`, `Symmetric`, `Asymmetric`)."""
    Symmetric = 0
    Asymmetric = 1


def _quantizer_module() -> types.ModuleType:
    """The ops of DeepSpeed's quantizer extension (csrc/quantization/pt_binding.cpp) that ZeRO++ calls: `quantize`
    and `dequantize` (qwZ, the weights' all-gathers, `CUDAQuantizer`), `swizzle_quant` and `quantized_reduction`
    (qgZ, `all_to_all_quant_reduce`); symmetric quantization only, as ZeRO++ uses it. Their outputs have the kernels'
    shapes and dtypes: int8 values (two 4-bit values a byte) and one fp32 scale per group."""
    import torch
    mod = types.ModuleType("phantora_quantizer")

    def symmetric(op: str, quant_type) -> None:
        if int(quant_type) != QuantizationType.Symmetric:
            raise NoStandIn(f"DeepSpeed op 'quantizer': {op} with {QuantizationType(int(quant_type)).name} "
                            f"quantization has no stand-in (symmetric only, as ZeRO++ uses it); see docs/deepspeed.md")

    def grouped(t, groups):
        """t's values as (groups, values per group), a remainder the kernels' integer division leaves out."""
        flat, g = t.reshape(-1), int(groups)
        per = flat.numel() // g
        return flat[:per * g].view(g, per)

    def group_absmax(x, groups):
        """One fp32 scale per group (the kernels' `{groups, 1}` params): a reduction reading the values once."""
        return torch.linalg.vector_norm(grouped(x, groups), ord=float("inf"), dim=1, keepdim=True,
                                        dtype=torch.float32)

    def pack(x, bits: int):
        """The int8 values, flat: a cast writing a byte per value (8 bits), a sum of pairs writing a byte per two
        values (4 bits); the input read once."""
        if bits == 8:
            return x.reshape(-1).to(torch.int8)
        if bits == 4:
            return x.reshape(-1, 2).sum(dim=1, dtype=torch.int8)
        raise NoStandIn(f"DeepSpeed op 'quantizer': {bits}-bit quantization has no stand-in (8 and 4 bits)")

    def quantize(input_vals, groups, num_bits, quant_type):
        symmetric("quantize", quant_type)
        sizes = list(input_vals.shape)
        sizes[-1] //= 8 // int(num_bits)
        return [pack(input_vals, int(num_bits)).view(sizes), group_absmax(input_vals, groups)]

    def dequantize(quantized_data, params, groups, num_bits, quant_type):
        """fp16 values = int8 values x their group's scale, written once (two values per byte read at 4 bits)."""
        symmetric("dequantize", quant_type)
        per_byte = 8 // int(num_bits)
        sizes = list(quantized_data.shape)
        sizes[-1] *= per_byte
        out = torch.empty(sizes, dtype=torch.float16, device=quantized_data.device)
        g = int(groups)
        values = quantized_data.reshape(g, -1, 1).expand(g, -1, per_byte)      # stride 0: each byte read once
        torch.mul(values, params.reshape(g, 1, 1), out=out.view(g, -1, per_byte))
        return out

    def swizzle_quant(input_vals, groups, num_bits, quant_type, pipeline_size, nodes, devices_per_node):
        """Quantized in the order of the two all-to-alls (the order costs nothing more): flat int8, fp32 scales."""
        symmetric("swizzle_quant", quant_type)
        return [pack(input_vals, int(num_bits)), group_absmax(input_vals, groups)]

    def quantized_reduction(input_vals, input_scales, in_groups, out_groups, num_bits, quant_type, devices_per_node):
        """The sum of the node's `devices_per_node` received slices, quantized again: each input byte read once,
        one output byte per `devices_per_node`; the scales likewise."""
        symmetric("quantized_reduction", quant_type)
        dpn = int(devices_per_node)
        sizes = list(input_vals.shape)
        sizes[-1] //= dpn
        vals = input_vals.reshape(dpn, -1).sum(dim=0, dtype=torch.int8).view(sizes)
        return [vals, grouped(input_scales, out_groups).amax(dim=1, keepdim=True)]

    def missing(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise NoStandIn(f"DeepSpeed op 'quantizer': function {name!r} of the compiled extension has no stand-in "
                        f"(stand-ins: dequantize, quantize, quantized_reduction, swizzle_quant: ZeRO++'s); see "
                        f"docs/deepspeed.md")

    for fn in (quantize, dequantize, swizzle_quant, quantized_reduction):
        setattr(mod, fn.__name__, fn)
    mod.QuantizationType = QuantizationType
    mod.Symmetric, mod.Asymmetric = QuantizationType.Symmetric, QuantizationType.Asymmetric
    mod.__getattr__ = missing
    return mod


STAND_INS = {
    "fused_adam": _fused_adam_module,
    "fused_lamb": _fused_lamb_module,
    "cpu_adam": lambda: _cpu_optimizer_module("adam"),
    "cpu_adagrad": lambda: _cpu_optimizer_module("adagrad"),
    "cpu_lion": lambda: _cpu_optimizer_module("lion"),
    "quantizer": _quantizer_module,
    "async_io": _async_io_module,
    "pin_memory": _pin_memory_module,
}


def install(builder_module: Any) -> None:
    """Make `OpBuilder.load()` answer with the stand-ins (idempotent)."""
    op_builder = builder_module.OpBuilder
    if getattr(op_builder.load, "_phantora", False):
        return
    loaded: dict[str, types.ModuleType] = {}

    def load(self, verbose=False):
        name = self.name
        mod = loaded.get(name)
        if mod is None:
            factory = STAND_INS.get(name)
            if factory is None:
                raise NoStandIn(
                    f"DeepSpeed op '{name}' ({type(self).__name__}) is a compiled extension that Phantora does not "
                    f"simulate (stand-ins: {', '.join(sorted(STAND_INS))}); see docs/deepspeed.md")
            mod = loaded[name] = factory()
        return mod

    def is_compatible(self, verbose=False):
        return self.name in STAND_INS

    load._phantora = True
    op_builder.load = load
    op_builder.jit_load = lambda self, verbose=True: load(self, verbose)
    op_builder.is_compatible = is_compatible
    for sub in _subclasses(op_builder):
        for attr in ("load", "jit_load", "is_compatible"):
            if attr in vars(sub):
                setattr(sub, attr, getattr(op_builder, attr))


def install_engine(engine_module: Any) -> None:
    """One iteration mark per optimizer step of the engine (`DeepSpeedEngine._take_model_step`), whatever the
    number of inner optimizer steps ZeRO takes (one per parameter sub-group)."""
    from ..fake import iteration_step
    engine = engine_module.DeepSpeedEngine
    if not getattr(engine._take_model_step, "_phantora", False):
        engine._take_model_step = iteration_step(engine._take_model_step)


def install_pipe_module(pipe_module: Any) -> None:
    """DeepSpeed's PipelineModule knows its stage once built (`num_stages` given in code or by a topology): checked
    against what `--ranks auto` assumed (pipeline_layout.py)."""
    from ..pipeline_layout import check_after_init
    check_after_init(getattr(pipe_module, "PipelineModule", None), "deepspeed.pipe.PipelineModule",
                     lambda m: (getattr(m, "stage_id", None), getattr(m, "num_stages", None)))


def install_state_initialization(module: Any) -> None:
    """DeepSpeed's mixed-precision and ZeRO optimizers step the inner optimizer once while they are built
    (`initialize_optimizer_states`, with zero gradients) to create its state: not a training iteration, so it marks
    none (it marked one, and the first iteration ran from `deepspeed.initialize` to the end of the first step)."""
    from ..fake import without_iteration_marks
    for obj in list(vars(module).values()):
        if isinstance(obj, type) and obj.__module__ == module.__name__ and "initialize_optimizer_states" in vars(obj):
            fn = vars(obj)["initialize_optimizer_states"]
            if callable(fn) and not getattr(fn, "_phantora", False):
                obj.initialize_optimizer_states = without_iteration_marks(fn)


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)
