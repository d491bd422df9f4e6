"""The memory plan of one order, computed by the compiled walk: the graph as integer arrays.

:func:`~onnx_remat.ortsim.planner.plan_memory` hands an order of a whole graph here first
(:func:`compiled_plan`). The graph is numbered once per graph state (:class:`PlanArrays`: tensors by
their place in the planner's use counts, nodes by index, each node's inputs and outputs as tensor
numbers, the kernels' alias and in-place pairs per output), kept with the planner's tables, so the
several orders the memory schedule plans of one graph, here or in a forked child, share it. The
walk itself (``compiled/plan_walk.c``: the reuse plan, the release plan and the memory pattern, as
:mod:`~onnx_remat.ortsim.planner` does them in Python) returns arrays, from which the same
:class:`~onnx_remat.ortsim.planner.MemoryPlan` is built. tests/ortsim/test_plan_arrays.py compares
the two plans field by field.

The compiled walk is built by the package's install (:mod:`~onnx_remat.compiled`). Where it is
missing, or turned off, or the walk finds a tensor planned twice (an order or graph onnxruntime
rejects), the Python planner plans it. Measured at 1.6 x 10^5 nodes: 0.67 s per plan in Python, 0.1 s here (``python -m
benchmarks.plan_speed``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np

from onnx_remat import compiled as native
from onnx_remat.ortsim.kernels import ALIAS, MAY_INPLACE, VARIADIC_ALIAS, alias_input, inplace_inputs, op_key

if TYPE_CHECKING:
    from onnx_remat.ortsim.graph import RuntimeGraph, RuntimeNode


def native_available() -> bool:
    """Whether the compiled walk is built and not turned off (:func:`~onnx_remat.compiled.compiled`)."""
    return native.compiled(native.plan_walk) is not None


@dataclass(slots=True)
class PlanArrays:
    """One graph numbered for the compiled walk: ``names[t]`` is tensor ``t`` (the order of the
    planner's use counts), the per-tensor arrays are indexed by it, the per-node ones by node index
    (a removed node has no inputs or outputs), and the alias and in-place arrays by output slot
    (``out_ids``' positions). ``callers``: the tensors in the caller's buffers, as the planner lists
    them first (name, kind)."""

    state: tuple  # the graph state it was numbered for
    names: list[str]
    use: np.ndarray  # int64: the use counts of an order running every live node once
    key: np.ndarray  # int32: the shape key's number (0: none)
    reusable: np.ndarray  # uint8 per key number: reused by shape
    size: np.ndarray  # int64: bytes, -1 where unknown
    declared: np.ndarray  # uint8: the shape is known to onnxruntime
    is_output: np.ndarray  # uint8: a graph output
    caller: np.ndarray  # uint8: a graph input or initializer
    in_ptr: np.ndarray  # int64 [nodes + 1]
    in_ids: np.ndarray  # int32, -1 for an absent optional input
    out_ptr: np.ndarray
    out_ids: np.ndarray
    may_share: np.ndarray  # uint8 per node: its kernel declares an alias or in-place pair
    alias: np.ndarray  # int32 per output slot: the input position it aliases, -1 none
    inpl_ptr: np.ndarray  # int64 [slots + 1]
    inpl_pos: np.ndarray  # int32: the input positions it may take over, in declaration order
    callers: list[tuple[str, str, int]]
    name_objects: np.ndarray  # object: the names, to pick columns of names by number
    live: int  # the live nodes: an order of the whole graph runs each once
    size_objects: np.ndarray  # object: the bytes, None where unknown


def plan_arrays(rg: RuntimeGraph, state: tuple, facts: Callable[[list[str]], TensorFacts]) -> PlanArrays:
    """``rg`` numbered for the walk (``state``: the graph state it is numbered for, which the caller
    compares before using it again). Tensors are numbered in the order first named (graph inputs,
    initializers, graph outputs, then every node's inputs and outputs): the plan does not depend on
    the numbering. ``facts``: what the planner reads of each tensor of a list."""
    nodes = rg.nodes
    live = [n for n in nodes if n is not None]
    ins = list(map(attrgetter("inputs"), live))
    outs = list(map(attrgetter("outputs"), live))
    callers_and_outputs = list(chain(rg.graph_inputs, rg.initializers, rg.graph_outputs))
    first_named = dict.fromkeys(chain(callers_and_outputs, chain.from_iterable(ins), chain.from_iterable(outs)))
    first_named.pop("", None)  # an absent optional input or output
    names = list(first_named)
    T = len(names)
    ids = dict(zip(names, range(T)))
    ids[""] = -1
    number = ids.__getitem__  # (mapped in C over every node's names: no Python call per name)
    in_ids = np.fromiter(map(number, chain.from_iterable(ins)), dtype=np.int32)
    out_ids = np.fromiter(map(number, chain.from_iterable(outs)), dtype=np.int32)
    index = np.fromiter(map(attrgetter("index"), live), dtype=np.int64, count=len(live))
    # ComputeReuseCount (planner._use_counts): one use per graph input, initializer, graph output,
    # reader and producer
    use = np.bincount(np.fromiter(map(number, callers_and_outputs), dtype=np.int64), minlength=T)
    use += np.bincount(in_ids[in_ids >= 0], minlength=T)
    use += np.bincount(out_ids[out_ids >= 0], minlength=T)
    out_ptr = _pointers(len(nodes), index, map(len, outs))
    # The alias and in-place pairs, per output slot: only the nodes whose kernel declares some
    # (elementwise ops, Reshape, ...; the walk reads them for those alone) are looked at.
    may_share = np.zeros(len(nodes), dtype=np.uint8)
    alias = np.full(len(out_ids), -1, dtype=np.int32)
    inpl_counts = np.zeros(len(out_ids), dtype=np.int64)
    inpl_pos: list[int] = []
    for n in live:
        if n.op not in _SHARING_OPS:
            continue
        spec = _share_spec(n.domain, n.op, len(n.inputs), len(n.outputs))
        if spec is None:
            continue
        may_share[n.index] = 1
        slot = int(out_ptr[n.index])
        for k, (a, positions) in enumerate(spec):
            alias[slot + k] = a
            if positions:
                inpl_counts[slot + k] = len(positions)
                inpl_pos.extend(positions)
    seen = set(rg.graph_inputs)
    callers = [(t, "input", ids[t]) for t in rg.graph_inputs]
    callers += [(t, "initializer", ids[t]) for t in rg.initializers if t not in seen]
    is_output = np.zeros(T, dtype=np.uint8)
    is_output[[ids[t] for t in rg.graph_outputs]] = 1
    caller = np.zeros(T, dtype=np.uint8)
    caller[[t for _, _, t in callers]] = 1
    nbytes, declared, keys, reusable = facts(names)
    size_objects = np.array(nbytes, dtype=object)
    return PlanArrays(
        state=state,
        names=names,
        use=use.astype(np.int64),
        key=np.array(keys, dtype=np.int32),
        reusable=np.array(reusable, dtype=np.uint8),
        size=np.array([-1 if s is None else s for s in nbytes], dtype=np.int64),
        declared=np.array(declared, dtype=np.uint8),
        is_output=is_output,
        caller=caller,
        in_ptr=_pointers(len(nodes), index, map(len, ins)),
        in_ids=in_ids,
        out_ptr=out_ptr,
        out_ids=out_ids,
        may_share=may_share,
        alias=alias,
        inpl_ptr=_pointers(len(out_ids), None, inpl_counts),
        inpl_pos=np.array(inpl_pos, dtype=np.int32),
        callers=callers,
        name_objects=np.array(names, dtype=object),
        live=len(live),
        size_objects=size_objects,
    )


# What a plan reads of the tensors of a list: their bytes (None: unknown), whether onnxruntime knows
# their shape, their shape key numbers (0: none), and per key number whether buffers of that key are
# reused by shape (onnx_remat.ortsim.planner's _ShapeKeys).
TensorFacts = tuple[list["int | None"], list[bool], list[int], list[bool]]


def _pointers(rows: int, at: np.ndarray | None, counts: Iterable[int] | np.ndarray) -> np.ndarray:
    """The CSR row pointers of ``rows`` rows, row ``at[k]`` (``k`` where None) holding ``counts[k]``
    entries, the others none."""
    ptr = np.zeros(rows + 1, dtype=np.int64)
    sizes = counts if isinstance(counts, np.ndarray) else np.fromiter(counts, dtype=np.int64)
    if at is None:
        ptr[1:] = sizes
    else:
        ptr[1:][at] = sizes
    np.cumsum(ptr, out=ptr)
    return ptr


# The op types some kernel declares an alias or in-place pair for (in any domain).
_SHARING_OPS = frozenset(op for _, op in chain(ALIAS, VARIADIC_ALIAS, MAY_INPLACE))


@functools.cache
def _share_spec(domain: str, op: str, n_inputs: int, n_outputs: int) -> tuple[tuple[int, tuple[int, ...]], ...] | None:
    """Per output, the input it aliases (-1: none) and those it may work in place on, for a node of
    this op and arity; None where the kernel declares no such pair (planner._kernel_shares)."""
    key = op_key(domain, op)
    if key not in ALIAS and key not in VARIADIC_ALIAS and key not in MAY_INPLACE:
        return None
    spec = []
    for k in range(n_outputs):
        a = alias_input(domain, op, k, n_inputs)
        spec.append((-1 if a is None else a, inplace_inputs(domain, op, k, n_inputs)))
    return tuple(spec)


@dataclass(slots=True)
class Walked:
    """What the compiled walk found for one order: per tensor number, its kind (the planner's, by
    code: :data:`KINDS`; 0 not planned, 1 the caller's), buffer (the number of the tensor owning it),
    allocation and release steps and offset in the block (-1: none), whether placed in the block;
    ``seq``: the tensors the order planned, in the order planned; per step, the bytes alive in the
    block, its size and the bytes alive outside it; the tensors of unknown size and those allocated
    outside the block, in order; the planned peak, the peak of live bytes and their steps."""

    kind: np.ndarray
    buffer: np.ndarray
    alloc_step: np.ndarray
    release_step: np.ndarray
    planned: np.ndarray
    offset: np.ndarray
    seq: np.ndarray
    live_bytes: np.ndarray
    block_bytes: np.ndarray
    dynamic_bytes: np.ndarray
    unknown: np.ndarray
    dynamic: np.ndarray
    planned_peak: int
    peak_live: int
    peak_live_step: int
    block_peak_step: int


# The walk's kind codes (compiled/plan_walk.c), by the planner's names.
KINDS = {3: "output", 4: "alias", 5: "inplace", 6: "reuse", 7: "allocate"}


def walk(arrays: PlanArrays, nodes: list[RuntimeNode]) -> Walked | None:
    """The compiled walk over ``nodes``, an order of the graph ``arrays`` numbers; None where the
    order does not run every live node once (it is planned as the graph of its nodes alone), or the
    walk finds some tensor planned twice or read before it is planned: the Python planner handles
    those cases."""
    a = arrays
    T, steps = len(a.names), len(nodes)
    if steps != a.live:
        return None
    steps_order = np.fromiter(map(attrgetter("index"), nodes), dtype=np.int32, count=steps)
    if steps and np.bincount(steps_order).max() > 1:
        return None
    # the walk's outputs, in the order it takes them (compiled/plan_walk.c)
    per_tensor = {name: np.empty(T, dtype=dtype) for name, dtype in _PER_TENSOR}
    per_step = {name: np.empty(steps, dtype=np.int64) for name in ("live_bytes", "block_bytes", "dynamic_bytes")}
    unknown, dynamic = np.empty(T, dtype=np.int32), np.empty(T, dtype=np.int32)
    assert native.plan_walk is not None
    once, n_planned, n_unknown, n_dynamic, peak, peak_live, peak_live_step, block_peak_step = native.plan_walk.walk(
        steps_order, a.use, a.key, a.reusable, a.size, a.declared, a.is_output, a.caller,
        a.in_ptr, a.in_ids, a.out_ptr, a.out_ids, a.may_share, a.alias, a.inpl_ptr, a.inpl_pos,
        *per_tensor.values(), *per_step.values(), unknown, dynamic,
    )  # fmt: skip
    if not once:
        return None
    per_tensor["seq"] = per_tensor["seq"][:n_planned]
    return Walked(
        **per_tensor,
        **per_step,
        unknown=unknown[:n_unknown],
        dynamic=dynamic[:n_dynamic],
        planned_peak=peak,
        peak_live=peak_live,
        peak_live_step=peak_live_step,
        block_peak_step=block_peak_step,
    )


# The walk's per-tensor outputs (Walked's fields), in the order it takes them.
_PER_TENSOR = (
    ("kind", np.int8),
    ("buffer", np.int32),
    ("alloc_step", np.int32),
    ("release_step", np.int32),
    ("planned", np.uint8),
    ("offset", np.int64),
    ("seq", np.int32),
)
