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

Every step is O(log n) amortized (sorted gap list, per-shape free lists), no recursion.
"""

from __future__ import annotations

import bisect
import functools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain

from onnx_remat.analysis.sizes import dtype_size
from onnx_remat.ortsim.graph import RuntimeGraph, RuntimeNode
from onnx_remat.ortsim.kernels import ALIAS, MAY_INPLACE, VARIADIC_ALIAS, alias_input, inplace_inputs, op_key

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
    """Simulate onnxruntime's reuse plan, release plan and memory pattern for ``order``."""
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


class _ShapeKeys:
    """The (element size, static shape) a buffer is reused by, and the freed buffers per key.

    Each distinct key gets a number once per plan and each tensor its key's number (-1: none), so
    the reuse plan's many asks per tensor are dict lookups, not a tuple built and hashed anew."""

    def __init__(self, sizes) -> None:
        self.sizes = sizes
        self.of: dict[str, int] = {}  # tensor -> key number
        self.numbers: dict[tuple, int] = {}  # key -> its number
        self.declared: dict[tuple, int] = {}  # (element type, dims) -> its key's number
        # per key number: freed buffers, most recently freed last; None for a scalar shape, whose
        # buffers onnxruntime never reuses this way
        self.free: list[list[str] | None] = []

    def key(self, t: str) -> int:
        k = self.of.get(t)
        if k is None:
            k = self.of[t] = self._number(t)
        return k

    def _number(self, t: str) -> int:
        declared = self.sizes.declared_type_and_dims(t)
        if declared is None:
            return -1
        k = self.declared.get(declared)
        if k is None:
            # element types of one size (float and int32, ...) share the key
            key = (_element_size(declared[0]), declared[1])
            k = self.numbers.get(key)
            if k is None:
                k = self.numbers[key] = len(self.free)
                self.free.append([] if len(key[1]) > 0 else None)
            self.declared[declared] = k
        return k

    def same_shape(self, x: str, o: str) -> bool:
        """``x`` and ``o`` have the same static shape and element size (scalars included)."""
        k = self.key(x)
        return k >= 0 and k == self.key(o)

    def push(self, buf: str) -> None:
        k = self.of.get(buf)
        if k is None:
            k = self.key(buf)
        stack = self.free[k] if k >= 0 else None
        if stack is not None:
            stack.append(buf)

    def pop(self, t: str) -> str | None:
        """The most recently freed buffer of ``t``'s exact shape, if any."""
        k = self.of.get(t)
        if k is None:
            k = self.key(t)
        stack = self.free[k] if k >= 0 else None
        return stack.pop() if stack else None


def _reuse_plan(rg: RuntimeGraph, nodes: list[RuntimeNode]) -> tuple[dict[str, TensorPlan], _Walk | None]:
    """``ComputeSingleStreamReusePlan``: where each tensor lives (module docstring, step 1).

    Also returns the buffers' reads and allocations as the walk saw them, which saves the later
    steps a walk of their own; None when those may differ from the final plan's (some tensor read
    before it is planned, or planned twice: an order or a graph onnxruntime would reject)."""
    nbytes = rg.sizes.nbytes
    graph_outputs = set(rg.graph_outputs)
    use = _use_counts(rg, nodes)
    tensors: dict[str, TensorPlan] = {t: TensorPlan(t, "input", t, nbytes(t)) for t in rg.graph_inputs}
    for t in rg.initializers:
        tensors.setdefault(t, TensorPlan(t, "initializer", t, nbytes(t)))
    keys = _ShapeKeys(rg.sizes)
    # tensor -> the tensor owning its buffer, for tensors in another's (``tensors[t].buffer``), kept
    # beside ``tensors`` because it is asked for every input and output of every node. Every buffer
    # named is a key of ``use``: a node's tensor, or one a freed buffer's use count was kept under.
    buffer: dict[str, str] = {}
    shares: dict[tuple[str, str], bool] = {}  # (domain, op) -> the kernel declares an alias or in-place pair
    walk = _Walk()
    reads = walk.reads
    planned_once = True  # every tensor is planned once, before it is read

    for step, n in enumerate(nodes):
        op = (n.domain, n.op)
        may_share = shares.get(op)
        if may_share is None:
            may_share = shares[op] = _kernel_shares(*op)
        for k, o in enumerate(n.outputs):
            if not o:
                continue
            if o in tensors or o in reads:
                planned_once = False
                buffer.pop(o, None)  # planned again: where it lived before no longer counts
            if o in graph_outputs:
                tensors[o] = TensorPlan(o, "output", o, nbytes(o), False, step)
                continue
            src, kind = _shared_input(n, k, o, use, buffer, keys) if may_share else (None, "allocate")
            if src is None and use[o] > 1:
                # An output nothing reads never takes a freed buffer: onnxruntime 1.19's planner
                # allocates it anew (microsoft/onnxruntime#21019: its buffer would be released before
                # it is written). It still may work in place or alias, and others may reuse it.
                src = keys.pop(o)
                kind = "reuse" if src is not None else kind
            if src is not None:
                buf = buffer.get(src, src)
                tensors[o] = TensorPlan(o, kind, buf, nbytes(o), False, step)
                buffer[o] = buf
                use[buf] += use[o]
            else:
                p = tensors[o] = TensorPlan(o, "allocate", o, nbytes(o), False, step)
                walk.allocated.setdefault(step, []).append(p)
        # one use of each input's and output's buffer is spent; a buffer with none left is free
        for t in n.inputs:
            if t:
                buf = buffer.get(t, t)
                reads[buf] = step
                left = use[buf] = use[buf] - 1
                if left == 0:
                    keys.push(buf)
        for t in n.outputs:
            if t:
                buf = buffer.get(t, t)
                left = use[buf] = use[buf] - 1
                if left == 0:
                    keys.push(buf)
    return tensors, walk if planned_once else None


def _kernel_shares(domain: str, op: str) -> bool:
    """The op's kernel declares some Alias, VariadicAlias or MayInplace pair (most declare none)."""
    key = op_key(domain, op)
    return key in ALIAS or key in VARIADIC_ALIAS or key in MAY_INPLACE


def _shared_input(
    n: RuntimeNode, k: int, o: str, use: dict[str, int], buffer: dict[str, str], keys: _ShapeKeys
) -> tuple[str | None, str]:
    """The input whose buffer output ``k`` (``o``) of ``n`` takes by Alias or MayInplace, and how."""
    inputs = n.inputs
    a = alias_input(n.domain, n.op, k, len(inputs))
    if a is not None and inputs[a]:
        return inputs[a], "alias"
    for a in inplace_inputs(n.domain, n.op, k, len(inputs)):
        x = inputs[a]
        if x and use[buffer.get(x, x)] == 1 and keys.same_shape(x, o):
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
