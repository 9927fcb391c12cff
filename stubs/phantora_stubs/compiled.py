"""`torch.compile` under simulation: Inductor decides the kernels, the simulation costs them (docs/compile.md).

A compiled region runs as on a CUDA machine up to the point where Inductor writes code: Dynamo traces the program's
Python into FX graphs (its graph breaks, guards and recompilations are its own), AOTAutograd splits forward and
backward and decides what is saved, Inductor decomposes and lowers the graph, and its scheduler fuses the lowered
nodes into kernels. None of that needs a GPU. Instead of generating and compiling Triton code, the compiled module
handed back to Inductor (`_SimulatedModule`) keeps the scheduler's kernel list:

- a generated (Triton) kernel becomes one op `inductor.pointwise` or `inductor.reduction` whose signature carries
  the kernel's name (the aten ops it fuses), its element counts and the bytes Inductor itself counts for it
  (`get_read_write_buffers_sizes`), costed by the cost model's `fused` family;
- an extern kernel (a GEMM, attention, a collective, an op Inductor falls back to) runs as the aten op it calls,
  through the interceptor as in eager mode, so it is costed and communicated exactly as there.

Calling the compiled module executes the post-grad FX graph node by node on fake tensors: the ops a generated kernel
covers run silently (no kernel of their own; their results take memory only where Inductor materializes a buffer),
and the generated kernel is issued after the last of them; the region's outputs take memory whichever op made them.

The compilation is not the framework's host work as counted elsewhere (its Python is Dynamo's and Inductor's, and a
real compilation also generates and compiles Triton code in worker processes): a process's first compilation charges
`COMPILE_FIRST_S` of host time, measured on GPU hosts, and none of its counted work; so does every other compilation
before the first iteration ends (they are part of the first step the measurement timed). A compilation after that (a
recompilation when a guard fails, a frame first reached later) charges `COMPILE_LATER_S`. A frame that gives
Inductor no graph (Megatron's `@jit_fuser` on a function with nothing to compute, a region with no ops) generates no
code and charges neither; Dynamo's own tracing of it is not modelled. A frame whose graph goes to another backend
(`backend="eager"`, `"aot_eager"`, a user's) is charged as Inductor's, as before: not measured.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import os
import sys
import threading
import warnings
from typing import Any

import torch

from .clock import METER, host_work
from . import kernel_recipe

COMPILE_FIRST_S = 12.45
"""Host seconds of a process's first compilation: the median, over 8 runs of the reference workload with `--compile`
on 1 x H100 and 2 x H200 hosts (16 and 32 cores; torch 2.11, Triton 3.6), of the first step's time less the median
step (8.75 to 14.16 s; groundtruth/local/compile-h100x1, compile-h200x2). It did not grow with the number of graphs
(2 or 4) or the model (1B to 8B): most of it is Inductor's and Triton's fixed start-up and the parallel compilation
of about twenty kernels."""

COMPILE_LATER_S = 8.28
"""Host seconds of a compilation after the first iteration: the median of 4 recompilations (a new sequence length,
compiled again with dynamic shapes) of the reference workload's compiled blocks, 1B and 3B, on an H100 host (16
cores; torch 2.11, Triton 3.6; empty compile caches): 7.62 to 8.95 s (groundtruth/local/compile-times-h100x1,
compile_times.py)."""


class _Silent(threading.local):
    depth = 0
    track = True       # whether the op's new storages take memory (a buffer Inductor materializes)


SILENT = _Silent()
"""Per-thread state of ops whose work is part of a generated kernel issued separately: the interceptor computes them
on fake tensors, issues no kernel and counts no dispatch, and tracks their memory only when `track` is set."""


@contextlib.contextmanager
def silent(track: bool):
    SILENT.depth += 1
    before, SILENT.track = SILENT.track, track
    try:
        yield
    finally:
        SILENT.depth -= 1
        SILENT.track = before


class _Calls(threading.local):
    begun = 0          # calls of compiled regions begun since this thread's last generated kernel


CALLS = _Calls()


def take_calls() -> int:
    """The compiled-region calls begun since the thread's previous generated kernel (reset): what the next generated
    kernel carries, so that the engine charges each call's host work (`[host] compiled_call_us`) at its launch."""
    n, CALLS.begun = CALLS.begun, 0
    return n


def _charge_calls() -> None:
    """Charge the calls no generated kernel will carry, as recorded host time (`[host] compiled_call_us` of the
    run's host preset; a replay keeps it as recorded)."""
    from .remote import compiled_host_us
    host_work(take_calls() * compiled_host_us()[1] * 1e-6)


class _Stats:
    frames = 0           # frames Dynamo compiled (recompilations included)
    recompiles = 0       # compilations of a frame that had been compiled before (a guard failed)
    eager: dict = {}     # frames Dynamo gave up on (a graph break in a loop, the recompile limit), by first line
    graphs = 0           # graphs Inductor lowered (a forward and a backward count two)
    handed = 0           # graphs Dynamo handed to a backend (Inductor or another: "eager", "aot_eager", a user's)
    generated = 0        # generated kernels in those graphs
    extern = 0           # extern kernels (GEMMs, attention, fallbacks, collectives) in them
    charged = False      # the first compilation's host time has been charged
    later = 0            # compilations after the first iteration, each charged COMPILE_LATER_S
    cudagraphs = False   # a mode that asked for CUDA graphs was simulated without them
    eager_flex = 0       # torch.compile(flex_attention | create_block_mask) calls simulated as the eager op


STATS = _Stats()
_CTX: Any = None


# ---- what Inductor decided ----------------------------------------------------------------------------------------

class _Kernel:
    """A generated kernel. Its sizes are ints, or sympy expressions of the graph's size symbols where Inductor
    compiled the graph for dynamic shapes: those are evaluated at each call, at the sizes it runs with."""
    __slots__ = ("kind", "name", "numel", "rnumel", "nbytes", "flops", "last", "device", "recipe", "stores")

    def __init__(self, kind: str, name: str, numel: Any, rnumel: Any, nbytes: Any, flops: Any, last: int,
                 device: int, recipe: str | None = None):
        self.kind, self.name, self.numel, self.rnumel = kind, name, numel, rnumel
        self.nbytes, self.flops, self.last, self.device = nbytes, flops, last, device
        self.recipe = recipe            # the fused ops, for `phantora profile` (kernel_recipe.py); static only
        self.stores: tuple[int, ...] = ()  # the FX nodes whose values it stores

    def symbolic(self) -> bool:
        return not all(isinstance(x, int) for x in (self.numel, self.rnumel, self.nbytes, self.flops))

    def at(self, sizes: dict) -> "_Kernel":
        """This kernel at the symbols' values `sizes`."""
        def value(x: Any) -> int:
            return x if isinstance(x, int) else int(x.xreplace(sizes))
        return _Kernel(self.kind, self.name, value(self.numel), value(self.rnumel), value(self.nbytes),
                       value(self.flops), self.last, self.device)


def _int(x: Any) -> Any:
    """An int, or (a size of a graph compiled for dynamic shapes) the sympy expression of the size symbols."""
    try:
        return int(x)
    except (TypeError, ValueError):
        import sympy
        return sympy.sympify(x)


def _product(xs: Any) -> Any:
    n = 1
    for x in xs:
        n = n * _int(x)
    return n


def _origins(ir_node: Any) -> Any:
    return ir_node.get_origins() if ir_node is not None and hasattr(ir_node, "get_origins") else ()


def _sympy_max(x: Any, floor: int) -> Any:
    import sympy
    return sympy.Max(x, floor)


def _size_symbols(gm: torch.fx.GraphModule) -> list[tuple[int, Any, int | None]]:
    """Where each size symbol of a graph compiled for dynamic shapes is found among its inputs: (input index,
    symbol, None) for a SymInt input, (input index, symbol, dim) for a tensor input's dimension."""
    import sympy
    found: dict[Any, tuple[int, Any, int | None]] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) and isinstance(val.node.expr, sympy.Symbol):
            found.setdefault(val.node.expr, (i, val.node.expr, None))
        elif isinstance(val, torch.Tensor):
            for d, size in enumerate(val.shape):
                if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                    found.setdefault(size.node.expr, (i, size.node.expr, d))
    return list(found.values())


def _flops(snode: Any) -> Any:
    """One FLOP per element of each fused aten op; a foreach (combo) kernel's parts each over their own elements."""
    from torch._inductor import scheduler as sch
    if isinstance(snode, sch.ForeachKernelSchedulerNode):
        total = 0
        for part in snode.snodes:
            total = total + _flops(part)
        return total
    numel, rnumel = _group_sizes(snode)
    ops = sum(1 for n in snode.get_nodes() for o in _origins(n.node) if getattr(o, "op", "") == "call_function")
    return ops * numel * (max(rnumel, 1) if isinstance(rnumel, int) else _sympy_max(rnumel, 1))


def _group_sizes(snode: Any) -> tuple[Any, Any]:
    """(elements, reduced elements per output) of a scheduler node's iteration group. A foreach (combo) kernel, one
    launch over many tensors (a compiled optimizer step), has no group of its own: its parts' elements, summed."""
    from torch._inductor import scheduler as sch
    if isinstance(snode, sch.ForeachKernelSchedulerNode):
        total = 0
        for part in snode.snodes:
            numel, rnumel = _group_sizes(part)
            total = total + numel * rnumel
        return total, 1
    group = snode.group[1] if isinstance(snode.group, tuple) and len(snode.group) == 2 else ()
    sizes = []
    for g in group:
        sizes.append(_product(g) if isinstance(g, (tuple, list)) else _int(g))
    numel = sizes[0] if sizes else 0
    rnumel = sizes[1] if len(sizes) > 1 else 1
    return numel, rnumel


def _plan(graph: Any) -> tuple[list[_Kernel], set[int], set[int]]:
    """The generated kernels of a lowered graph (each with the index of its last FX node), the FX nodes that extern
    kernels run, and the FX nodes whose values Inductor materializes in memory."""
    from torch._inductor import scheduler as sch
    from torch._inductor.utils import get_fused_kernel_name
    from torch._inductor.virtualized import V

    graph._update_scheduler()           # Inductor's own scheduler: fusion decided as for code generation
    fx_nodes = list(graph.module.graph.nodes)
    index = {node: i for i, node in enumerate(fx_nodes)}
    materialized: set[int] = set()
    value_of: dict[str, int] = {n.target: i for i, n in enumerate(fx_nodes) if n.op == "placeholder"}
    for buf in graph.buffers:
        node = getattr(buf, "origin_node", None)
        found = [index[o] for o in _origins(buf) if o in index]   # the value stored: its chain's last op
        if node in index:
            materialized.add(index[node])
        elif found:
            materialized.add(max(found))
        held = _holder(buf, [index[node]] if node in index else [], sorted(found, reverse=True), fx_nodes)
        if held is not None:
            value_of[buf.get_name()] = held
    kernels: list[_Kernel] = []
    extern: set[int] = set()
    for snode in graph.scheduler.nodes:
        if isinstance(snode, sch.NopKernelSchedulerNode):
            continue
        if isinstance(snode, sch.ExternKernelSchedulerNode):
            # the FX node whose lowering is this call (its `origins` also name the ops fused into its inputs). An
            # extern kernel's output realized while a later node was lowered names that node as its origin node
            # (a GEMM whose result goes straight into an all-reduce: the collective's wait): then its origins say
            origins = _origins(snode.node)
            node = getattr(snode.node, "origin_node", None)
            found = [index[o] for o in origins if o in index]
            if node in index and (node in origins or not found):
                extern.add(index[node])
            elif found:
                extern.add(max(found))
            continue
        device = snode.get_device()
        origins = [index[o] for n in snode.get_nodes() for o in _origins(n.node) if o in index]
        if not origins or device is None or device.type != "cuda":
            continue
        reduction = any(isinstance(n, sch.SchedulerNode) and n.is_reduction() for n in snode.get_nodes())
        numel, rnumel = _group_sizes(snode)
        per_output = rnumel if isinstance(rnumel, int) else _sympy_max(rnumel, 1)
        nbytes = int(snode.get_read_write_buffers_sizes())
        if not (isinstance(numel, int) and isinstance(rnumel, int)):
            # Inductor counts a kernel's bytes at the sizes it compiled for (the symbols' hints); at another size
            # they scale with the kernel's iteration space (its activations; a weight it reads is small beside them)
            space = numel * per_output
            at_hint = int(V.graph.sizevars.optimization_hint(space, fallback=1)) or 1
            nbytes = nbytes * space / at_hint
        kernel = _Kernel("reduction" if reduction else "pointwise",
                         get_fused_kernel_name(snode.get_nodes(), "original_aten"), numel, rnumel,
                         nbytes, _flops(snode), max(origins), device.index or 0)
        if not kernel.symbolic():
            kernel.recipe, kernel.stores = _recipe(snode, fx_nodes, index, value_of, set(origins), nbytes)
        kernels.append(kernel)
    # a value two kernels store (a reduction Inductor splits in two stores its partial and its final result under
    # the same FX node): a recipe of either would time both
    stored = collections.Counter(i for k in kernels for i in k.stores)
    for k in kernels:
        if any(stored[i] > 1 for i in k.stores):
            k.recipe = None
    return kernels, extern, materialized


def _holder(buf: Any, first: list[int], others: list[int], fx_nodes: list) -> int | None:
    """The FX node whose value a buffer holds: its origin node, else the latest of its origins, of the buffer's
    sizes and dtype (a buffer realized as an extern kernel's input names that kernel among its origins)."""
    try:
        size = [int(s) for s in buf.get_size()]       # sympy integers; a symbolic size raises TypeError
        dtype = buf.get_dtype()
    except (TypeError, ValueError, NotImplementedError, AttributeError):
        return None
    for i in (*first, *others):
        val = fx_nodes[i].meta.get("val")
        if isinstance(val, torch.Tensor) and val.dtype == dtype and list(val.shape) == size \
                and all(isinstance(s, int) for s in val.shape):
            return i
    return None


def _recipe(snode: Any, fx_nodes: list, index: dict, value_of: dict[str, int], origins: set[int],
            nbytes: int) -> tuple[str | None, tuple[int, ...]]:
    """(recipe, FX nodes of the values it stores) of a generated kernel: the ops from what it reads (buffers of other
    kernels, graph inputs) to what it stores (buffers a node outside the kernel uses). None where a buffer cannot be
    traced to its FX node, or the recipe's traffic is not the kernel's (Inductor's count, within a factor 1.5)."""
    members = {n.get_name() for n in snode.get_nodes()}
    written = set()
    outputs = []
    for n in snode.get_nodes():
        for buf in n.get_outputs():
            written.add(buf.get_name())
            if any(not u.is_weak and u.get_name() not in members for u in buf.users):
                outputs.append(buf.get_name())
    reads = {d.name for d in snode.read_writes.reads} - written
    if not outputs or any(name not in value_of for name in (*outputs, *reads)):
        return None, ()
    out_nodes = [value_of[name] for name in outputs]
    boundary = {value_of[name] for name in reads}
    if boundary & set(out_nodes):
        return None, tuple(out_nodes)
    inside: set[int] = set()
    todo = list(out_nodes)
    while todo:
        i = todo.pop()
        if i in inside or i in boundary or fx_nodes[i].op != "call_function" or i not in origins:
            continue
        inside.add(i)
        todo.extend(index[a] for a in fx_nodes[i].all_input_nodes)
    if not set(out_nodes) <= inside:
        return None, tuple(out_nodes)
    text, moved = kernel_recipe.recipe([fx_nodes[i] for i in sorted(inside)], [fx_nodes[i] for i in out_nodes])
    if text is None or not (nbytes / 1.5 <= moved <= nbytes * 1.5):
        return None, tuple(out_nodes)
    return text, tuple(out_nodes)


# ---- the compiled module ------------------------------------------------------------------------------------------

class _SimulatedModule:
    """What `GraphLowering.compile_to_module` returns under simulation; `call(args)` runs the graph (see above)."""

    __file__ = "<phantora: simulated Inductor module>"

    def __init__(self, gm: torch.fx.GraphModule, kernels: list[_Kernel], extern: set[int], materialized: set[int]):
        self.gm = gm
        self.nodes = list(gm.graph.nodes)
        self.kernels = kernels
        self.symbolic = any(k.symbolic() for k in kernels)
        self.symbols = _size_symbols(gm) if self.symbolic else []
        self.by_sizes: dict[tuple, dict[int, list[_Kernel]]] = {}
        self.after = self._place(kernels)
        self.materialized = materialized
        self.silent = {i for i, n in enumerate(self.nodes) if n.op == "call_function" and i not in extern}

    @staticmethod
    def _place(kernels: list[_Kernel]) -> dict[int, list[_Kernel]]:
        after: dict[int, list[_Kernel]] = {}
        for k in kernels:
            after.setdefault(k.last, []).append(k)
        return after

    def _kernels_for(self, args: list) -> dict[int, list[_Kernel]]:
        """The kernels, their sizes at this call's values of the size symbols (dynamic shapes)."""
        values = []
        for i, _sym, dim in self.symbols:
            a = args[i]
            values.append(int(a) if dim is None else int(a.shape[dim]))
        key = tuple(values)
        placed = self.by_sizes.get(key)
        if placed is None:
            sizes = {sym: v for (_i, sym, _d), v in zip(self.symbols, values)}
            try:
                placed = self._place([k.at(sizes) if k.symbolic() else k for k in self.kernels])
            except TypeError as e:          # a symbol not among the inputs: the sizes cannot be known here
                raise RuntimeError(f"phantora: a kernel of a graph compiled for dynamic shapes has a size that "
                                   f"depends on a symbol not given by the graph's inputs ({e}); this is not "
                                   f"simulated") from None
            self.by_sizes[key] = placed
        return placed

    def call(self, args: list) -> Any:
        METER.enter(1)           # the wrapper's own Python is not the framework's; its launches are charged,
        CALLS.begun += 1         # and the host work of the call itself (`[host] compiled_call_us`)
        try:
            icpt = _CTX.interceptor
            if self.symbolic:
                self.after = self._kernels_for(args)
            out = _Runner(self, icpt).run(*args, enable_io_processing=False)
            # what the region returns is in memory, whichever op made it
            icpt.mem.track([t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)])
        finally:
            METER.exit()
        if CALLS.begun and not self.kernels:
            _charge_calls()              # a region of extern kernels only: no generated kernel carries its call
        args.clear()              # Inductor's calling convention: the callee owns (and drops) its inputs
        return out


def _plain(x: Any) -> Any:
    """FX's immutable lists and dicts as plain ones: the foreach ops' schemas refuse them (`_foreach_pow`'s exponent
    list, which Inductor's generated code passes as a list)."""
    if isinstance(x, list):
        return [_plain(v) for v in x]
    if type(x) is tuple:
        return tuple(_plain(v) for v in x)
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


class _Runner(torch.fx.Interpreter):
    def __init__(self, mod: _SimulatedModule, icpt: Any):
        super().__init__(mod.gm, garbage_collect_values=True)
        self.mod = mod
        self.icpt = icpt
        self.position = {n: i for i, n in enumerate(mod.nodes)}

    def run_node(self, n):
        i = self.position[n]
        if i in self.mod.silent:
            with silent(i in self.mod.materialized):
                out = super().run_node(n)
        else:
            out = super().run_node(n)
        for k in self.mod.after.get(i, ()):
            self.icpt.emit_fused(k.kind, k.name, k.numel, k.rnumel, k.nbytes, k.flops, k.device, k.recipe)
        return out

    def call_function(self, target, args, kwargs):
        name = target.overloadpacket.__name__ if isinstance(target, torch._ops.OpOverload) else ""
        if name.startswith("_foreach_"):            # their list arguments' schemas refuse FX's immutable lists
            args, kwargs = _plain(args), _plain(kwargs)
        out = super().call_function(target, args, kwargs)
        if out is None and name.startswith("_foreach_") and name.endswith("_") and args and isinstance(args[0], list):
            # an in-place foreach op Inductor put in place of its functional form (a compiled optimizer step): the
            # graph still takes the functional result's items, which are the updated inputs (as Inductor lowers it)
            return list(args[0])
        return out


def _compile_to_module(self):
    """GraphLowering.compile_to_module under simulation: the scheduler's kernels, no code."""
    kernels, extern, materialized = _plan(self)
    STATS.graphs += 1
    STATS.generated += len(kernels)
    STATS.extern += len(extern)
    return _SimulatedModule(self.module, kernels, extern, materialized)


# ---- Dynamo's compilation: shadowed, priced -----------------------------------------------------------------------

def _wrap_compile(original):
    def _compile(code, *args, **kwargs):
        from .interceptor import shadow
        handed = STATS.handed
        converted = False
        METER.enter(1)
        try:
            with shadow():                                 # tracing on fake tensors is no GPU work
                out = original(code, *args, **kwargs)
            converted = getattr(out, "guarded_code", None) is not None    # else a frame with nothing to compile
            return out
        except Exception as e:
            from torch._dynamo.exc import Unsupported
            if isinstance(e, Unsupported):
                # Dynamo gave the frame up (it runs eagerly, or the error reaches the program under fullgraph=True)
                reason = str(e).strip().splitlines()[0][:100] if str(e).strip() else type(e).__name__
                STATS.eager[reason] = STATS.eager.get(reason, 0) + 1
            raise
        finally:
            METER.exit()
            if converted:
                STATS.frames += 1
                if len(args) >= 10 and args[9] is not None:    # cache_entry: this frame was compiled before
                    STATS.recompiles += 1
            if STATS.handed == handed:
                pass                 # no graph for the backend (a frame with no ops): nothing compiled, none charged
            elif not STATS.charged:
                STATS.charged = True
                host_work(COMPILE_FIRST_S)
            elif _iterations_done():
                STATS.later += 1
                host_work(COMPILE_LATER_S)
    _compile.__wrapped__ = original                        # type: ignore[attr-defined]
    return _compile


def _iterations_done() -> int:
    from .fake import ITERATIONS
    return ITERATIONS[0]


def _shadowed(fn):
    """`fn` as the stubs' own work, its ops computed for their metadata only (no kernel, no memory)."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        from .interceptor import shadow
        METER.enter(2)
        try:
            with shadow():
                return fn(*args, **kwargs)
        finally:
            METER.exit()
    wrapped.__wrapped__ = fn                                   # type: ignore[attr-defined]
    return wrapped


def _unmetered_call(call):
    """Dynamo's frame callback (it decides whether a frame needs compiling, and compiles it) as the stubs' own work:
    its Python depends on Dynamo's caches and hashing, not on the program, and a real compilation's host time is
    charged as COMPILE_FIRST_S instead."""
    def wrapped(self, *args, **kwargs):
        METER.enter(1)
        try:
            return call(self, *args, **kwargs)
        finally:
            METER.exit()
    wrapped.__wrapped__ = call                             # type: ignore[attr-defined]
    return wrapped


_EAGER_MODULE = "torch.nn.attention.flex_attention"


def _init_group_in_the_rank(call):
    """Dynamo runs an optimizer's `_init_group` for real while it traces a compiled step (the state it makes, Adam's
    moments, must exist before the graph), with the dispatch modes off: on the rank's fake device its
    `torch.zeros(..., device="cuda")` failed. It runs under the rank's fake mode and interceptor, as eagerly."""
    @functools.wraps(call)
    def call_method(self, tx, name, args, kwargs):
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
        if name != "_init_group" or _CTX is None or _CTX.interceptor in _get_current_dispatch_mode_stack():
            return call(self, tx, name, args, kwargs)
        with _CTX.fake_mode, _CTX.interceptor:
            return call(self, tx, name, args, kwargs)
    return call_method


def _no_cuda_graphs(asked: str) -> None:
    """Say once that CUDA graphs, asked for by `asked`, are not simulated."""
    if not STATS.cudagraphs:
        STATS.cudagraphs = True
        print(f"phantora: torch.compile({asked}) is simulated without CUDA graphs: its kernels are launched one by "
              "one (docs/compile.md)", file=sys.stderr, flush=True)


def _wrap_torch_compile(original):
    def compile(model: Any = None, *args: Any, **kwargs: Any) -> Any:
        if getattr(model, "__module__", None) == _EAGER_MODULE:
            # torch.compile(flex_attention) / torch.compile(create_block_mask), as TorchTitan does: Inductor would
            # make a Triton template of it; simulated as the eager higher-order op instead
            STATS.eager_flex += 1
            return model
        import torch._inductor.config as inductor_config
        mode = kwargs.get("mode")
        options = dict(kwargs.get("options") or {})
        if inductor_config.triton.cudagraphs:          # set by the program for every compilation
            inductor_config.triton.cudagraphs = False
            options["triton.cudagraphs"] = True
        if mode in ("reduce-overhead", "max-autotune") or options.get("triton.cudagraphs"):
            # CUDA graphs replay recorded launches: not simulated; the region's kernels are launched one by one
            _no_cuda_graphs(f"mode={mode!r}" if mode in ("reduce-overhead", "max-autotune")
                            else "triton.cudagraphs=True")
            if mode == "reduce-overhead":
                kwargs.pop("mode")
            elif mode == "max-autotune":
                kwargs["mode"] = "max-autotune-no-cudagraphs"
            options.pop("triton.cudagraphs", None)
            if options:
                kwargs["options"] = options
            else:
                kwargs.pop("options", None)
        return original(model, *args, **kwargs)
    compile.__wrapped__ = original                         # type: ignore[attr-defined]
    compile.__doc__ = original.__doc__
    return compile


def report() -> str | None:
    """One line on what was compiled in this process, or None when nothing was."""
    if not STATS.frames and not STATS.eager and not STATS.eager_flex:
        return None
    import torch._dynamo.utils as dynamo_utils
    breaks = dynamo_utils.counters.get("graph_break", {})
    n_breaks = sum(breaks.values())
    line = (f"phantora: torch.compile: {STATS.frames} frame(s) compiled ({STATS.recompiles} recompilation(s)), "
            f"{n_breaks} graph break(s), {STATS.graphs} Inductor graph(s) with {STATS.generated} generated and "
            f"{STATS.extern} extern kernel(s)")
    if STATS.eager:
        top = sorted(STATS.eager.items(), key=lambda kv: -kv[1])[:3]
        line += (f"; {sum(STATS.eager.values())} frame(s) Dynamo gave up on, run eagerly: "
                 + "; ".join(f"{n} x {reason}" for reason, n in top))
    if STATS.charged:
        line += f"; host time charged: {COMPILE_FIRST_S:g} s for the first step's compilation"
        if STATS.later:
            line += f", {COMPILE_LATER_S:g} s for each of {STATS.later} later compilation(s)"
    if STATS.eager_flex:
        line += f"; {STATS.eager_flex} compiled flex-attention function(s) simulated as the eager op"
    if breaks:
        top = sorted(breaks.items(), key=lambda kv: -kv[1])[:3]
        line += "; breaks: " + "; ".join(f"{n} x {reason[:120]}" for reason, n in top)
    return line


def _report_at_exit() -> None:
    line = report()
    if line is not None and os.environ.get("PHANTORA_RANK", "0") == "0":
        print(line, file=sys.stderr, flush=True)


# ---- what is not simulated ----------------------------------------------------------------------------------------

def _extern_flex_lowerings() -> None:
    """Flex attention in a compiled region as an extern kernel: the higher-order op itself, run at its place in the
    graph and costed as in eager mode (the `flex_attention` / `flex_attention_backward` signatures, their density
    from the block mask). Inductor would make a Triton template of it, whose configuration is chosen on a GPU."""
    from torch._inductor import ir, lowering
    import torch._inductor.kernel.flex  # noqa: F401 - registers the flex lowerings (replaced here)

    def graph_modules(x: Any) -> Any:        # the score/mask subgraphs as the GraphModules the op takes
        return x.graph_module if isinstance(x, ir.Subgraph) else x

    def extern(op: Any) -> Any:
        def lower(*args: Any, **kwargs: Any) -> Any:
            args, kwargs = torch.utils._pytree.tree_map(graph_modules, (args, kwargs),
                                                        is_leaf=lambda x: isinstance(x, ir.Subgraph))
            outputs = ir.FallbackKernel.create(op, *args, **kwargs)
            return torch.utils._pytree.tree_map(
                lambda o: ir.TensorBox.create(o) if isinstance(o, ir.IRNode) else o, outputs,
                is_leaf=lambda x: isinstance(x, ir.IRNode))
        return lower

    for name in ("flex_attention", "flex_attention_backward"):
        op = getattr(torch.ops.higher_order, name, None)
        if op is not None and op in lowering.lowerings:
            lowering.lowerings[op] = extern(op)


# ---- installation -------------------------------------------------------------------------------------------------

def bind(ctx) -> None:
    """The rank's context (its interceptor issues the compiled regions' kernels)."""
    global _CTX
    _CTX = ctx


def _import_inductor_without_triton() -> None:
    """Import Inductor as a CPU-only torch sees it: without Triton. A framework may have imported the `triton`
    stand-in already (triton_stub.py; torchao, DeepSpeed do), and torch's own `import triton` would then find it in
    sys.modules and take Triton's code paths (kernel templates chosen by timing them on a GPU)."""
    saved = {name: sys.modules.pop(name) for name in list(sys.modules)
             if name == "triton" or name.startswith("triton.")}
    try:
        import torch._inductor.compile_fx  # noqa: F401
        import torch._inductor.kernel  # noqa: F401 - the kernel lowerings (GEMMs, scaled GEMMs, flex attention)
        import torch._inductor.runtime.triton_compat  # noqa: F401
        import torch._inductor.select_algorithm  # noqa: F401
    finally:
        sys.modules.update(saved)


# The stand-ins for what is C++ in torch (ProcessGroupNCCL and its work objects, DDP's C++ helpers): Dynamo never
# traces C++, but it would take these Python frames for code to compile (a frame reached from torch's own skipped
# code, such as DistributedDataParallel's forward calling `dist._broadcast_coalesced`) or to inline.
_CPP_STAND_INS = ("comm", "dist_collectives", "dist_ddp", "dist_emit", "dist_groups", "dist_p2p", "exchange")


def _skip_stand_ins() -> None:
    """Dynamo skips the stand-ins' files as it skips a C function: run as they are, a graph break where compiled
    code calls one."""
    from torch._dynamo import trace_rules

    for name in _CPP_STAND_INS:
        trace_rules.add(f"{__package__}.{name}")


def install(original_compile: Any) -> None:
    """Let torch.compile run Dynamo, AOTAutograd and Inductor's lowering and scheduling; simulate the kernels.
    `original_compile`: torch's own torch.compile, which the wrapper installed here calls."""
    _import_inductor_without_triton()
    import torch._inductor.codecache as codecache
    codecache.triton_key = lambda: None    # no Triton: its version is part of Inductor's cache keys (unused here)
    import torch._dynamo.convert_frame as convert_frame
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    import torch._inductor.scheduler as scheduler
    from torch._inductor.graph import GraphLowering

    # nothing is read from or written to the compile caches: a simulated compilation must not be reused as code
    inductor_config.fx_graph_cache = False
    inductor_config.fx_graph_remote_cache = False
    inductor_config.autotune_local_cache = False
    inductor_config.autotune_remote_cache = False
    functorch_config.enable_autograd_cache = False
    inductor_config.compile_threads = 1
    if inductor_config.triton.cudagraphs:        # the program's setting: off, and said so (as for a mode's, below)
        _no_cuda_graphs("triton.cudagraphs=True")
    inductor_config.triton.cudagraphs = False
    # GEMMs stay cuBLAS calls (max-autotune's Triton templates would need a GPU to choose among them)
    inductor_config.max_autotune_gemm_backends = "ATEN"
    # constant folding evaluates tensors at compile time: placeholders have no values to fold
    inductor_config.joint_graph_constant_folding = False
    scheduler.has_triton = lambda: True      # the CUDA backend's fusion rules are Triton's; no Triton is needed
    GraphLowering.compile_to_module = _compile_to_module
    _extern_flex_lowerings()
    if not hasattr(convert_frame._compile, "__wrapped__"):
        convert_frame._compile = _wrap_compile(convert_frame._compile)
    import torch._dynamo.output_graph as output_graph
    call = output_graph.OutputGraph.call_user_compiler
    if not hasattr(call, "__wrapped__"):
        @functools.wraps(call)
        def call_user_compiler(self, *args, **kwargs):
            STATS.handed += 1        # a frame with ops: its graph goes to the backend (an empty frame's does not)
            return call(self, *args, **kwargs)
        output_graph.OutputGraph.call_user_compiler = call_user_compiler
    # Inductor's compilation of a graph, also where AOTAutograd compiles the backward lazily at the first backward
    import torch._inductor.compile_fx as compile_fx
    if not hasattr(compile_fx._compile_fx_inner, "__wrapped__"):
        compile_fx._compile_fx_inner = _shadowed(compile_fx._compile_fx_inner)
    for cls in (convert_frame.CatchErrorsWrapper, convert_frame.ConvertFrame, convert_frame.ConvertFrameAssert):
        if not hasattr(cls.__call__, "__wrapped__"):
            cls.__call__ = _unmetered_call(cls.__call__)
    _skip_stand_ins()
    import torch._dynamo.variables.optimizer as dynamo_optimizer
    method = dynamo_optimizer.OptimizerVariable.call_method
    if not hasattr(method, "__wrapped__"):
        dynamo_optimizer.OptimizerVariable.call_method = _init_group_in_the_rank(method)
    torch.compile = _wrap_torch_compile(original_compile)
    # Inductor checks its inputs' alignment through data_ptr(), which a fake tensor answers with a warning
    warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
    atexit.register(_report_at_exit)
