"""Analysis pass: onnxruntime's activation memory plan for one training step, simulated.

Input: a :class:`~onnx_remat.ortsim.optimizer.RuntimeGraph` (the graph onnxruntime runs) and an
execution order of its nodes. Output: a :class:`MemoryPlan`: for every step the bytes of
activations alive and the size of the planned block so far, the planned peak, and for every
tensor where it lives.

It follows onnxruntime 1.19 (``core/framework/allocation_planner.cc``, ``mem_pattern_planner.h``,
``session_state.cc`` ``GeneratePatternGroupCache``), for one CPU stream:

1. *Reuse plan.* Walking the order, each output of a node gets, in this order of preference:
   nothing if it is a graph output (the caller's buffer); its input's buffer if the kernel
   aliases them (Reshape, Identity, PassThrough, ... see :mod:`onnx_remat.ortsim.kernels`) or may
   work in place on an input this node reads last with the same static shape; the buffer of a
   tensor freed earlier with exactly the same static shape and element size (most recently freed
   first), unless no node reads the output; else a new buffer. Use counts decide when a buffer
   is free: it is free after its last reader, or right after its producer when nothing reads it.
2. *Release plan.* A buffer is released after the last node (in the order) that reads any tensor
   sharing it. A buffer nobody reads is never released within the step.
3. *Memory pattern.* Buffers whose size is statically known (shapes onnxruntime infers; see
   :mod:`onnx_remat.ortsim.shapes`) are placed in one block: each allocation, rounded up to 256
   bytes, goes into the free gap that wastes least (lowest offset on ties), or at the end of the
   highest live block, extending the block. The block's final size is the *planned peak*: what
   onnxruntime allocates in one piece at the start of a step (``measure``'s planned_peak_bytes).
   Tensors of unknown static size are allocated separately at run time; they are reported, with
   their size where the ``_grad`` naming rule gives one, but are not part of the block.

Every step is O(log n) amortized (sorted gap list, per-shape free lists), no recursion. What every
plan of one graph reads of it whatever the order (the use counts, each tensor's shape key and bytes)
is read once per graph and kept with it (:class:`_PlanTables`; :func:`prepare_plans` reads it before
a fork, for the children's plans too): the memory schedule plans three or four orders of one graph,
and a plan of an order with the tables read is 0.65 s rather than 1.1 s at 1.6 x 10^5 nodes. An
order of part of the graph reads what it needs for its own nodes.

That is this module's planner, the reference. An order of the whole graph is planned by the same
steps compiled, where the install built them (:mod:`~onnx_remat.ortsim.plan_arrays`, 0.2 s rather
than 0.9 s at 1.5 x 10^5 nodes with the graph read): :func:`plan_memory` takes that plan, and
:func:`python_plan` is this one.
"""

from __future__ import annotations

import bisect
import functools
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from onnx_remat.analysis.sizes import dtype_size
from onnx_remat.ortsim.graph import RuntimeGraph, RuntimeNode
from onnx_remat.ortsim.kernels import ALIAS, MAY_INPLACE, VARIADIC_ALIAS, alias_input, inplace_inputs, op_key
from onnx_remat.ortsim.plan_arrays import (
    KINDS,
    PlanArrays,
    TensorFacts,
    Walked,
    native_available,
    plan_arrays,
    walk,
)

ALIGNMENT = 256


_element_size = functools.cache(dtype_size)  # per element type, asked for every tensor of every plan


def align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


@dataclass(slots=True)  # slots: one per tensor per plan, several plans alive at once
class TensorPlan:
    """Where one tensor lives: its own buffer (``kind`` 'allocate'), another's ('reuse', 'alias',
    'inplace'), the caller's ('input', 'output', 'initializer')."""

    name: str
    kind: str
    buffer: str  # the tensor that owns the buffer
    nbytes: int | None  # bytes of the tensor (None: unknown)
    planned: bool = False  # placed in the planned block
    alloc_step: int | None = None
    release_step: int | None = None  # None: lives to the end of the step
    offset: int | None = None


@dataclass
class MemoryPlan:
    """The simulated plan. Steps index ``order``."""

    order: list[int]  # node indices
    live_bytes: list[int]  # planned bytes alive after each step's allocations
    block_bytes: list[int]  # size of the planned block after each step
    dynamic_bytes: list[int]  # bytes of known size allocated outside the block, alive at each step
    tensors: dict[str, TensorPlan]
    planned_peak_bytes: int
    peak_live_bytes: int
    peak_live_step: int
    block_peak_step: int  # the step whose allocation gave the block its final size
    unknown: list[str] = field(default_factory=list)  # allocated tensors of unknown size
    dynamic: list[str] = field(default_factory=list)  # allocated outside the block (size from naming)

    def live_at(self, step: int) -> list[TensorPlan]:
        """Planned buffers alive at ``step`` (after its allocations, before its releases), largest
        first. A buffer is named by the tensor it holds at that step (the latest tensor written
        into it: a reused buffer holds its last reuser)."""
        holders: dict[str, tuple[int, TensorPlan]] = {}
        for t in self.tensors.values():
            if t.alloc_step is not None and t.alloc_step <= step and t.kind in ("allocate", "reuse", "inplace"):
                held = holders.get(t.buffer)
                if held is None or t.alloc_step >= held[0]:
                    holders[t.buffer] = (t.alloc_step, t)
        out = []
        for t in self.tensors.values():
            if (
                t.planned
                and t.kind == "allocate"
                and t.alloc_step is not None
                and t.alloc_step <= step
                and (t.release_step is None or t.release_step >= step)
            ):
                out.append((t, holders.get(t.name, (0, t))[1]))
        out.sort(key=lambda pair: -(pair[0].nbytes or 0))
        return [holder if holder.nbytes is not None else buf for buf, holder in out]


class _Block:
    """onnxruntime's MemPatternPlanner: best-fit placement in one growing block."""

    def __init__(self) -> None:
        self.offsets: list[int] = []  # live block offsets, sorted
        self.size_at: dict[int, int] = {}
        self.gaps: list[tuple[int, int]] = []  # (size, offset) of free gaps below the highest block
        self.buffer_size = 0
        self.live = 0

    def _end(self) -> int:
        if not self.offsets:
            return 0
        o = self.offsets[-1]
        return o + self.size_at[o]

    def allocate(self, size: int) -> int:
        end = self._end()
        k = bisect.bisect_left(self.gaps, (size, -1))
        best = None
        if k < len(self.gaps):
            best = self.gaps[k]
        tail = self.buffer_size - end
        if best is not None and not (tail >= size and tail - size < best[0] - size):
            gap_size, offset = self.gaps.pop(k)
            if gap_size > size:
                bisect.insort(self.gaps, (gap_size - size, offset + size))
        else:
            offset = end
        bisect.insort(self.offsets, offset)
        self.size_at[offset] = size
        self.buffer_size = max(self.buffer_size, offset + size)
        self.live += size
        return offset

    def free(self, offset: int) -> None:
        size = self.size_at.pop(offset)
        self.live -= size
        i = bisect.bisect_left(self.offsets, offset)
        del self.offsets[i]
        prev_end = 0
        if i > 0:
            p = self.offsets[i - 1]
            prev_end = p + self.size_at[p]
        if prev_end < offset:
            self._drop_gap(offset - prev_end, prev_end)
        if i < len(self.offsets):
            nxt = self.offsets[i]
            if nxt > offset + size:
                self._drop_gap(nxt - offset - size, offset + size)
            bisect.insort(self.gaps, (nxt - prev_end, prev_end))

    def _drop_gap(self, size: int, offset: int) -> None:
        k = bisect.bisect_left(self.gaps, (size, offset))
        if k < len(self.gaps) and self.gaps[k] == (size, offset):
            del self.gaps[k]


def plan_memory(rg: RuntimeGraph, order: Sequence[int]) -> MemoryPlan:
    """Simulate onnxruntime's reuse plan, release plan and memory pattern for ``order``.

    An order running every live node of ``rg`` once is planned by the compiled walk where it is
    built (:mod:`~onnx_remat.ortsim.plan_arrays`: the same plan); other orders, and every order
    without it, in Python (:func:`python_plan`)."""
    nodes = [n for n in map(rg.nodes.__getitem__, order) if n is not None]
    if native_available():
        arrays = numbered(rg)
        walked = walk(arrays, nodes)
        if walked is not None:
            return _walked_plan(list(order), arrays, walked)
    return python_plan(rg, order, nodes)


def _walked_plan(order: list[int], arrays: PlanArrays, w: Walked) -> MemoryPlan:
    """The :class:`MemoryPlan` the compiled walk found (tensors listed as the Python planner lists them:
    the caller's, then each as first planned). The columns are read by numpy and the plans made by
    ``map``: a Python loop over the tensors took most of the plan's time."""
    names, sizes = arrays.name_objects, arrays.size_objects
    tensors: dict[str, TensorPlan] = {name: TensorPlan(name, how, name, sizes[t]) for name, how, t in arrays.callers}
    seq = w.seq
    name_col = names[seq].tolist()
    release, offset = w.release_step[seq], w.offset[seq]
    release_col, offset_col = release.astype(object), offset.astype(object)
    release_col[release < 0] = None
    offset_col[offset < 0] = None
    plans = map(
        TensorPlan,
        name_col,
        _KIND_NAMES[w.kind[seq]].tolist(),
        names[w.buffer[seq]].tolist(),
        sizes[seq].tolist(),
        w.planned[seq].astype(bool).tolist(),
        w.alloc_step[seq].tolist(),
        release_col.tolist(),
        offset_col.tolist(),
    )
    tensors.update(zip(name_col, plans))
    return MemoryPlan(
        order=order,
        live_bytes=w.live_bytes.tolist(),
        block_bytes=w.block_bytes.tolist(),
        dynamic_bytes=w.dynamic_bytes.tolist(),
        tensors=tensors,
        planned_peak_bytes=w.planned_peak,
        peak_live_bytes=w.peak_live,
        peak_live_step=w.peak_live_step,
        block_peak_step=w.block_peak_step,
        unknown=names[w.unknown].tolist(),
        dynamic=names[w.dynamic].tolist(),
    )


# The planner's kind names by the compiled walk's codes (KINDS; the others are never in ``seq``).
_KIND_NAMES = np.array([KINDS.get(code, "") for code in range(max(KINDS) + 1)], dtype=object)


def python_plan(rg: RuntimeGraph, order: Sequence[int], nodes: list[RuntimeNode] | None = None) -> MemoryPlan:
    """:func:`plan_memory` in Python (the reference the compiled walk is compared with); ``nodes``:
    the live nodes of ``order``, if listed already."""
    if nodes is None:
        nodes = [n for n in (rg.nodes[i] for i in order) if n is not None]
    tensors, walk = _reuse_plan(rg, nodes)
    if walk is None:
        walk = _walk_final_plan(nodes, tensors)
    release_at = _release_plan(tensors, walk.reads)
    return _memory_pattern(rg, list(order), len(nodes), tensors, walk.allocated, release_at)


@dataclass
class _Walk:
    """What the release plan and the memory pattern need from the walk over the order, by step."""

    reads: dict[str, int] = field(default_factory=dict)  # buffer -> last step reading it, in first-read order
    allocated: dict[int, list[TensorPlan]] = field(default_factory=dict)  # step -> its outputs' own buffers


def _use_counts(rg: RuntimeGraph, nodes: list[RuntimeNode]) -> dict[str, int]:
    """``ComputeReuseCount``: one use per graph input, initializer, reader, producer and graph output."""
    # Counter counts in C; in a node's lists the empty name is an absent optional input or output
    use = Counter(chain(rg.graph_inputs, rg.initializers, rg.graph_outputs))
    use.update(filter(None, chain.from_iterable(chain(n.inputs, n.outputs) for n in nodes)))
    return dict(use)


# The number of "no shape key" in _ShapeKeys: a tensor whose buffer is never reused by shape.
_NO_KEY = 0


class _ShapeKeys:
    """The (element size, static shape) a buffer is reused by: a number per distinct key, and per
    tensor its key's number (:data:`_NO_KEY`: none), so the reuse plan's many asks per tensor are
    list and dict lookups, not a tuple built and hashed anew. ``reusable[k]``: whether buffers of key
    ``k`` are reused by shape (onnxruntime never reuses a scalar-shaped buffer this way)."""

    def __init__(self, sizes, tensors) -> None:
        tensors = list(tensors)
        numbers, self.reusable = number_shape_keys(map(sizes.declared_type_and_dims, tensors))
        self.of: dict[str, int] = dict(zip(tensors, numbers))

    def free_lists(self) -> list[list[str] | None]:
        """Empty free lists for one plan, per key number (None: not reused by shape)."""
        return [[] if reusable else None for reusable in self.reusable]


def number_shape_keys(declared: Iterable[tuple[int, tuple] | None]) -> tuple[list[int], list[bool]]:
    """Per tensor, the number of its shape key (:class:`_ShapeKeys`), from its declared (element type,
    dims) (None: not declared, :data:`_NO_KEY`); and per number, whether buffers of that key are
    reused by shape."""
    numbers: dict[tuple, int] = {}  # key -> its number
    declared_numbers: dict[tuple, int] = {}  # (element type, dims) -> its key's number
    reusable: list[bool] = [False]  # _NO_KEY
    out: list[int] = []
    for d in declared:
        if d is None:
            out.append(_NO_KEY)
            continue
        k = declared_numbers.get(d)
        if k is None:
            # element types of one size (float and int32, ...) share the key
            key = (_element_size(d[0]), d[1])
            k = numbers.get(key)
            if k is None:
                k = numbers[key] = len(reusable)
                reusable.append(len(key[1]) > 0)
            declared_numbers[d] = k
        out.append(k)
    return out, reusable


@dataclass(slots=True)
class _PlanTables:
    """What every memory plan of one graph reads of it whatever the order, read once per graph
    (:func:`_tables`): the memory schedule plans several orders of one graph, in this process and
    in a forked child given the tables made before the fork."""

    state: tuple[int, int, int, int]  # the graph state they were read for (_graph_state)
    live: int  # live nodes: an order running each of them once has ``use`` as its use counts
    use: dict[str, int]  # _use_counts over every live node (copied by each plan: it counts down)
    keys: _ShapeKeys  # every tensor's shape key
    sizes: dict[str, int | None]  # every tensor's bytes (TensorSizes.nbytes), asked for as a dict


def _graph_state(rg: RuntimeGraph) -> tuple[int, int, int, int]:
    """What changes when anything a plan reads of ``rg`` changes: every edit is counted (``edits``)
    or adds a node; a stand-in's graph has initializers and sizes objects of its own."""
    return (rg.edits, len(rg.nodes), id(rg.initializers), id(rg.sizes))


def _tables(rg: RuntimeGraph) -> _PlanTables:
    """The graph's :class:`_PlanTables`, read now unless read already for the graph as it is."""
    state = _graph_state(rg)
    cached = rg.plan_tables
    if isinstance(cached, _PlanTables) and cached.state == state:
        return cached
    live = [n for n in rg.nodes if n is not None]
    use = _use_counts(rg, live)
    tables = _PlanTables(state, len(live), use, _ShapeKeys(rg.sizes, use), _sizes_of(rg, use))
    rg.plan_tables = tables
    return tables


def numbered(rg: RuntimeGraph) -> PlanArrays:
    """``rg`` numbered as integer arrays for the compiled walks (:func:`~onnx_remat.ortsim.plan_arrays.plan_arrays`),
    kept on ``rg`` as :func:`_tables` keeps the tables, for the graph state it was made for: the
    memory plans and the list schedulers (:class:`~onnx_remat.scheduling.orders.ListScheduler`) of
    one graph state share it."""
    state = _graph_state(rg)
    cached = rg.plan_arrays
    if isinstance(cached, PlanArrays) and cached.state == state:
        return cached
    arrays = plan_arrays(rg, state, functools.partial(_tensor_facts, rg.sizes))
    rg.plan_arrays = arrays
    return arrays


def _tensor_facts(sizes, names: list[str]) -> TensorFacts:
    """What a plan reads of each tensor (:data:`~onnx_remat.ortsim.plan_arrays.TensorFacts`)."""
    nbytes, declared, keys = sizes.plan_facts(names)
    numbers, reusable = number_shape_keys(keys)
    return nbytes, declared, numbers, reusable


def _sizes_of(rg: RuntimeGraph, tensors) -> dict[str, int | None]:
    """The bytes of ``tensors`` (:meth:`~onnx_remat.analysis.sizes.TensorSizes.nbytes`)."""
    nbytes = rg.sizes.nbytes
    return {t: nbytes(t) for t in tensors}


def prepare_plans(rg: RuntimeGraph) -> None:
    """Read what every memory plan of ``rg`` reads whatever the order now (the graph numbered for the
    compiled walk, else :class:`_PlanTables`), so that forked children planning orders of ``rg``
    share it rather than each reading it."""
    if native_available():
        numbered(rg)
    else:
        _tables(rg)


def _reuse_plan(rg: RuntimeGraph, nodes: list[RuntimeNode]) -> tuple[dict[str, TensorPlan], _Walk | None]:
    """``ComputeSingleStreamReusePlan``: where each tensor lives (module docstring, step 1).

    Also returns the buffers' reads and allocations as the walk saw them, which saves the later
    steps a walk of their own; None when those may differ from the final plan's (some tensor read
    before it is planned, or planned twice: an order or a graph onnxruntime would reject)."""
    graph_outputs = set(rg.graph_outputs)
    use, keys, size_of = _counts_keys_and_sizes(rg, nodes)
    key_of = keys.of
    free = keys.free_lists()
    tensors = _callers_tensors(rg, size_of)
    # tensor -> the tensor owning its buffer, for tensors in another's (``tensors[t].buffer``), kept
    # beside ``tensors`` because it is asked for every input and output of every node. Every buffer
    # named is a key of ``use``: a node's tensor, or one a freed buffer's use count was kept under.
    buffer: dict[str, str] = {}
    buffer_of = buffer.get
    shares: dict[tuple[str, str], bool] = {}  # (domain, op) -> the kernel declares an alias or in-place pair
    walk = _Walk()
    reads = walk.reads
    allocated = walk.allocated
    planned_once = True  # every tensor is planned once, before it is read

    for step, n in enumerate(nodes):
        outputs = n.outputs
        op = (n.domain, n.op)
        may_share = shares.get(op)
        if may_share is None:
            may_share = shares[op] = _kernel_shares(*op)
        for k, o in enumerate(outputs):
            if not o:
                continue
            if o in tensors or o in reads:
                planned_once = False
                buffer.pop(o, None)  # planned again: where it lived before no longer counts
            if o in graph_outputs:
                tensors[o] = TensorPlan(o, "output", o, size_of[o], False, step)
                continue
            src = None
            kind = "allocate"
            if may_share:
                src, kind = _shared_input(n, k, o, use, buffer, key_of)
            if src is None and use[o] > 1:
                # An output nothing reads never takes a freed buffer: onnxruntime 1.19's planner
                # allocates it anew (microsoft/onnxruntime#21019: its buffer would be released before
                # it is written). It still may work in place or alias, and others may reuse it.
                stack = free[key_of[o]]
                if stack:  # the most recently freed buffer of o's exact shape
                    src = stack.pop()
                    kind = "reuse"
            if src is not None:
                buf = buffer_of(src, src)
                tensors[o] = TensorPlan(o, kind, buf, size_of[o], False, step)
                buffer[o] = buf
                use[buf] += use[o]
            else:
                p = tensors[o] = TensorPlan(o, "allocate", o, size_of[o], False, step)
                at_step = allocated.get(step)
                if at_step is None:
                    allocated[step] = [p]
                else:
                    at_step.append(p)
        # one use of each input's and output's buffer is spent; a buffer with none left is free
        for t in n.inputs:
            if t:
                buf = buffer_of(t, t)
                reads[buf] = step
                left = use[buf] = use[buf] - 1
                if left == 0:
                    stack = free[key_of[buf]]
                    if stack is not None:
                        stack.append(buf)
        for t in outputs:
            if t:
                buf = buffer_of(t, t)
                left = use[buf] = use[buf] - 1
                if left == 0:
                    stack = free[key_of[buf]]
                    if stack is not None:
                        stack.append(buf)
    return tensors, walk if planned_once else None


def _counts_keys_and_sizes(
    rg: RuntimeGraph, nodes: list[RuntimeNode]
) -> tuple[dict[str, int], _ShapeKeys, dict[str, int | None]]:
    """The use counts the reuse plan of ``nodes`` counts down (a copy: its own), the shape keys and
    the tensors' bytes: the graph's tables where ``nodes`` are its live nodes, each once (an order of
    the whole graph), else read for these nodes."""
    if _whole_graph(rg, nodes):
        tables = _tables(rg)
        return dict(tables.use), tables.keys, tables.sizes
    use = _use_counts(rg, nodes)
    return use, _ShapeKeys(rg.sizes, use), _sizes_of(rg, use)


def _whole_graph(rg: RuntimeGraph, nodes: list[RuntimeNode]) -> bool:
    """Whether ``nodes`` are the live nodes of ``rg``, each once (an order of the whole graph)."""
    live = sum(1 for n in rg.nodes if n is not None)
    return len(nodes) == live and len({n.index for n in nodes}) == live


def _callers_tensors(rg: RuntimeGraph, size_of: dict[str, int | None]) -> dict[str, TensorPlan]:
    """The plans of the tensors in the caller's buffers: graph inputs, then initializers
    (``size_of``: every tensor's bytes)."""
    tensors = {t: TensorPlan(t, "input", t, size_of[t]) for t in rg.graph_inputs}
    for t in rg.initializers:
        tensors.setdefault(t, TensorPlan(t, "initializer", t, size_of[t]))
    return tensors


def _kernel_shares(domain: str, op: str) -> bool:
    """The op's kernel declares some Alias, VariadicAlias or MayInplace pair (most declare none)."""
    key = op_key(domain, op)
    return key in ALIAS or key in VARIADIC_ALIAS or key in MAY_INPLACE


def _shared_input(
    n: RuntimeNode, k: int, o: str, use: dict[str, int], buffer: dict[str, str], key_of: dict[str, int]
) -> tuple[str | None, str]:
    """The input whose buffer output ``k`` (``o``) of ``n`` takes by Alias or MayInplace, and how
    (``key_of``: :class:`_ShapeKeys`' numbers: an in-place input has ``o``'s static shape, scalars
    included)."""
    inputs = n.inputs
    a = alias_input(n.domain, n.op, k, len(inputs))
    if a is not None and inputs[a]:
        return inputs[a], "alias"
    for a in inplace_inputs(n.domain, n.op, k, len(inputs)):
        x = inputs[a]
        if x and use[buffer.get(x, x)] == 1:
            kx = key_of[x]
            if kx != _NO_KEY and kx == key_of[o]:
                return x, "inplace"
    return None, "allocate"


def _walk_final_plan(nodes: list[RuntimeNode], tensors: dict[str, TensorPlan]) -> _Walk:
    """The buffers' reads and allocations by step, from the final plan."""
    walk = _Walk()
    for step, n in enumerate(nodes):
        for t in n.inputs:
            p = tensors.get(t) if t else None
            if p is not None:
                walk.reads[p.buffer] = step
        for o in n.outputs:
            p = tensors.get(o) if o else None
            if p is not None and p.kind == "allocate":
                walk.allocated.setdefault(step, []).append(p)
    return walk


def _release_plan(tensors: dict[str, TensorPlan], reads: dict[str, int]) -> dict[int, list[str]]:
    """``GenerateDeallocationPlan``: a buffer is released after the last reader of any tensor sharing
    it; returns step -> buffers released there (and sets each buffer's ``release_step``).

    ``reads``: buffer -> the last step reading a tensor in it, in the order first read."""
    release_at: dict[int, list[str]] = {}
    for name, step in reads.items():
        p = tensors.get(name)
        if p is not None and p.kind == "allocate":
            p.release_step = step
            release_at.setdefault(step, []).append(name)
    return release_at


def _memory_pattern(
    rg: RuntimeGraph,
    order: list[int],
    steps: int,
    tensors: dict[str, TensorPlan],
    allocated: dict[int, list[TensorPlan]],
    release_at: dict[int, list[str]],
) -> MemoryPlan:
    """``MemPatternPlanner`` with program counters: place each statically sized buffer in one block."""
    sizes = rg.sizes
    block = _Block()
    live_bytes: list[int] = []
    block_bytes: list[int] = []
    dynamic_bytes: list[int] = []
    unknown: list[str] = []
    dynamic: list[str] = []
    dyn_live = 0
    dyn_release: dict[int, int] = {}
    peak_live = -1
    peak_live_step = 0
    block_peak_step = 0
    for step in range(steps):
        for p in allocated.get(step, ()):
            o = p.name
            size = p.nbytes
            if size is None:
                unknown.append(o)
            elif sizes.declared(o):
                # a size is known only when every symbolic dimension is bound (TensorSizes.nbytes),
                # so a declared shape with a size has no unbound symbols
                if size == 0:
                    continue
                before = block.buffer_size
                p.offset = block.allocate(align(size))
                p.planned = True
                if block.buffer_size > before:
                    block_peak_step = step
            else:
                dynamic.append(o)
                dyn_live += size
                if p.release_step is not None:
                    dyn_release[p.release_step] = dyn_release.get(p.release_step, 0) + size
        live = block.live
        live_bytes.append(live)
        block_bytes.append(block.buffer_size)
        dynamic_bytes.append(dyn_live)
        if live > peak_live:
            peak_live, peak_live_step = live, step
        released = release_at.get(step)
        if released is not None:
            for buf in released:
                p = tensors[buf]
                if p.planned and p.offset is not None:
                    block.free(p.offset)
        if dyn_release:
            dyn_live -= dyn_release.pop(step, 0)
    return MemoryPlan(
        order=order,
        live_bytes=live_bytes,
        block_bytes=block_bytes,
        dynamic_bytes=dynamic_bytes,
        tensors=tensors,
        planned_peak_bytes=block.buffer_size,
        peak_live_bytes=max(peak_live, 0),
        peak_live_step=peak_live_step,
        block_peak_step=block_peak_step,
        unknown=unknown,
        dynamic=dynamic,
    )
