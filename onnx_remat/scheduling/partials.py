"""Rewrite pass: a shared weight's partial gradients made as soon as their call's gradient exists.

Input: a training graph (``onnx.ModelProto``). Output: a :class:`GatedPartials` with a new
ModelProto, or None where there is nothing to gate; the input is not changed. The memory schedule
(:class:`~onnx_remat.scheduling.schedule.MemorySchedule`) emulates the result as one more candidate
graph and keeps it only where its planned peak is the lowest.

A weight that several calls read (ALBERT's one layer run for every layer, a cell run once per time
step: :mod:`onnx_remat.analysis.calls`) gets one partial gradient per call, which the gradient
builder adds with one ``Sum`` before the parameter's ``InPlaceAccumulatorV2``. onnxruntime's DEFAULT
order reaches a node from its readers (:mod:`onnx_remat.ortsim.order`), so it makes every partial
when it reaches that ``Sum``, at the end of the backward pass, and each call's input to its partial
(the layer's activation, stored or recomputed) stays alive until then. Measured on ALBERT-base (12
calls, dynamo export): per-call recompute releases 612 MiB of activations but lowers the planned
peak 7% (708.8 -> 657.7 MiB); with the partials made here, 31% (486.7 MiB; bit-identical).

Here each partial is made where PyTorch's autograd makes it, as soon as its call's output gradient
exists: every other reader of the gradient tensors the partial is computed from (``dY`` of that
call, which the backward pass reads on towards the calls before it) reads them through a
``com.microsoft::PassThrough(dY, partial)``, whose first output is ``dY`` itself (an alias: no copy),
so nothing before the partial can go on. The partial's *producers* are the nodes above it that only
it reads (a ``Reshape`` of the activation for its ``Gemm``), up to :data:`MAX_CONE` of them; the
gradient tensors they read from the rest of the graph are the ones gated. The node list is then
sorted again, stably (what a gate makes wait moves after the partial). A gate that would close a
cycle (a partial that itself depends on a reader it would hold back, through the gates taken
before it too) is not added (:func:`_with_gates`).

Nothing computed changes: the ``Sum`` keeps its inputs in their order, a ``PassThrough`` passes its
input on untouched, and what onnxruntime's optimizer fuses is left alone: no sum, partial or
gradient made by a fused node is gated (a gate reading the ``Gemm`` of a partial would stop
onnxruntime fusing the ``Sum`` into it, which rounds differently), and the memory schedule keeps
the gated graph only where onnxruntime fuses the same nodes in it as in its input
(:func:`same_fusions`). So loss and gradients stay bit-identical. The partials themselves wait in
memory for the ``Sum`` (adding them as they come would change the rounding); where they outweigh
the activations they free, the schedule keeps another candidate. Sums with a partial of an
embedding's ``GatherGrad`` (tied input and output embeddings) are left to
:mod:`onnx_remat.scheduling.accumulate`, which has a form for them.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import helper

from onnx_remat.graph import tags
from onnx_remat.graph.conventions import ACCUMULATOR_OPS, MS_DOMAIN, is_gradient_node_name
from onnx_remat.graph.node_list import with_nodes
from onnx_remat.graph.toposort import index_order, ready_order
from onnx_remat.ortsim.graph import RuntimeGraph
from onnx_remat.scheduling.accumulate import PASSING_OPS, may_have_parameter_sums

# The name of the graph this pass makes among the memory schedule's candidates.
PARTIALS_EARLY = "partials early"

# At most this many nodes above a partial count as its own (a Reshape, a Transpose, the Gemm): a
# bound on the walk, far above what the gradient builder writes for one partial.
MAX_CONE = 8
# The node list is sorted again at most this many nodes' worth in all while gates are taken (a
# graph of 10^4 nodes: 200 times); the gates after that are not taken.
SORT_BUDGET = 2_000_000


@dataclass
class GatedPartials:
    """The graph with its shared weights' partial gradients made early: the model, and per gated
    partial the gradient tensors whose other readers now wait for it."""

    model: onnx.ModelProto
    gated: dict[str, list[str]]  # partial gradient -> the tensors gated on it

    @property
    def gates(self) -> int:
        """How many ``PassThrough`` gates were added (one per gated tensor)."""
        return len({t for ts in self.gated.values() for t in ts})


def gate_partials(model: onnx.ModelProto, fused: frozenset[str] = frozenset()) -> GatedPartials | None:
    """``model`` with each shared weight's partial gradients made as soon as they can be (the
    module docstring), or None where no gradient sum has partials to gate. ``fused``: the names of
    the nodes onnxruntime's optimizer fuses with others in ``model`` (:func:`fused_nodes`): a sum,
    partial or gradient made by one of them is not gated, since a gate reading it could stop the
    fusion, which would change how it rounds (a ``Sum`` fused into the ``Gemm`` of a partial)."""
    if not may_have_parameter_sums(model):
        return None
    nodes = list(model.graph.node)
    producer: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for o in n.output:
            if o:
                producer[o] = i
        for t in n.input:
            if t:
                readers.setdefault(t, []).append(i)
    planned: list[tuple[str, str, list[int]]] = []  # (gated tensor, partial, its other readers)
    for i in range(len(nodes)):
        partials = _parameter_sum(i, nodes, readers)
        if partials is None or nodes[i].name in fused:
            continue
        cones = [_cone(p, nodes, producer, readers) for p in partials]
        if any(cone is None or any(nodes[k].name in fused for k in cone[0]) for cone in cones):
            continue
        for partial, cone in zip(partials, cones, strict=True):
            assert cone is not None
            inside, frontier = cone
            for t in frontier:
                others = [r for r in readers.get(t, []) if r not in inside]
                if others and nodes[producer[t]].name not in fused:
                    planned.append((t, partial, others))
    if not planned:
        return None
    return _with_gates(model, nodes, producer, planned)


def fused_nodes(rg: RuntimeGraph) -> frozenset[str]:
    """The names of the model's nodes that onnxruntime's optimizer fuses with others in ``rg``
    (:mod:`onnx_remat.ortsim.optimizer`): each runtime node standing for more than one."""
    return frozenset(name for n in rg.live() if len(n.origin) > 1 for name in n.origin)


def same_fusions(a: RuntimeGraph, b: RuntimeGraph) -> bool:
    """Whether onnxruntime fuses the same groups of model nodes in ``a`` and ``b`` (a gated graph
    and its input): only then does every node compute as it did, bit for bit."""
    groups = [{frozenset(n.origin) for n in rg.live() if len(n.origin) > 1} for rg in (a, b)]
    return groups[0] == groups[1]


def _parameter_sum(i: int, nodes: list[onnx.NodeProto], readers: dict[str, list[int]]) -> list[str] | None:
    """The partials of node ``i`` where it is a parameter's gradient ``Sum`` of two or more distinct
    partials, none an embedding's ``GatherGrad``; else None."""
    total = nodes[i]
    if total.op_type != "Sum" or total.domain not in ("", "ai.onnx") or len(total.input) < 2 or not total.output:
        return None
    partials = list(total.input)
    if len(set(partials)) != len(partials) or not all(partials):
        return None
    t = total.output[0]
    for _ in range(len(PASSING_OPS) + 1):  # the Sum's one reader, through ops that pass it on, is an accumulator
        users = readers.get(t, [])
        if len(users) != 1:
            return None
        user = nodes[users[0]]
        if user.op_type in ACCUMULATOR_OPS:
            return partials
        if user.op_type not in PASSING_OPS or len(user.output) != 1:
            return None
        t = user.output[0]
    return None


def _cone(
    partial: str, nodes: list[onnx.NodeProto], producer: dict[str, int], readers: dict[str, list[int]]
) -> tuple[set[int], list[str]] | None:
    """The nodes above ``partial`` that only it needs (its producer, and each gradient node whose
    outputs only those read), and the gradient tensors they read from the rest of the graph; None
    for an embedding's ``GatherGrad`` partial (tied embeddings: left to the accumulation pass)."""
    top = producer.get(partial)
    if top is None:
        return None
    inside = {top}
    frontier: list[str] = []
    work = [top]
    while work:
        node = nodes[work.pop()]
        if node.op_type == "GatherGrad":
            return None
        for t in node.input:
            q = producer.get(t)
            if q is None or q in inside or not is_gradient_node_name(nodes[q].name):
                continue  # a forward tensor (the call's activation), a parameter or a constant
            only_ours = all(r in inside for o in nodes[q].output if o for r in readers.get(o, []))
            if only_ours and len(inside) < MAX_CONE:
                inside.add(q)
                work.append(q)
            elif t not in frontier:
                frontier.append(t)
    return inside, frontier


def _with_gates(
    model: onnx.ModelProto,
    nodes: list[onnx.NodeProto],
    producer: dict[str, int],
    planned: list[tuple[str, str, list[int]]],
) -> GatedPartials | None:
    """``model`` with those of the ``planned`` gates that close no cycle, its node list sorted again,
    stably. The gates are taken in turn: one closes a cycle where a reader it would hold back is
    above its partial, through the gates taken before it too. That is searched upward from the
    partial, among the nodes after the earliest of those readers in a topological order of the
    graph so far, which is made again where a gate taken breaks it (at most
    :data:`SORT_BUDGET` nodes sorted in all: past it, no more gates are taken)."""
    count = len(nodes)
    above: list[list[int]] = [[producer[t] for t in n.input if t in producer] for n in nodes]
    position = list(range(count))  # a topological order of the graph with the gates taken so far
    budget = SORT_BUDGET
    taken: list[tuple[str, str, list[int]]] = []
    for t, partial, others in planned:
        source = producer[partial]
        if _reaches(source, set(others), min(position[r] for r in others), above, position):
            continue  # a reader it would hold back is above the partial: a cycle
        taken.append((t, partial, others))
        for r in others:
            above[r].append(source)
        if any(position[r] < position[source] for r in others):
            if budget < count:
                break
            budget -= count
            position = _stable_positions(above)
    if not taken:
        return None
    rewired = _gate_nodes(nodes, taken)
    order = index_order([list(n.input) for n in rewired], [list(n.output) for n in rewired])
    if len(order) != len(rewired):  # (cannot happen: every gate taken was tested)
        raise RuntimeError("gating partial gradients closed a cycle")
    gated: dict[str, list[str]] = {}
    for t, partial, _ in taken:
        gated.setdefault(partial, []).append(t)
    return GatedPartials(with_nodes(model, [rewired[i] for i in order]), gated)


def _reaches(source: int, targets: set[int], lowest: int, above: list[list[int]], position: list[int]) -> bool:
    """Whether one of ``targets`` is ``source`` or above it (``above``: each node's producers), searched
    among the nodes at ``position`` ``lowest`` or later only (a topological order: none before
    the earliest target can be below one)."""
    seen = {source}
    work = [source]
    while work:
        x = work.pop()
        if x in targets:
            return True
        for y in above[x]:
            if y not in seen and position[y] >= lowest:
                seen.add(y)
                work.append(y)
    return False


def _stable_positions(above: list[list[int]]) -> list[int]:
    """Each node's position in the topological order of ``above`` (each node's producers) that keeps
    the node list's order wherever it can (:func:`~onnx_remat.graph.toposort.ready_order`: among the
    ready nodes, the earliest first)."""
    below: dict[int, list[int]] = {}
    waiting: dict[int, int] = {}
    for x, ps in enumerate(above):
        unique = set(ps)
        waiting[x] = len(unique)
        for p in unique:
            below.setdefault(p, []).append(x)
    order = ready_order(range(len(above)), below, waiting)
    if len(order) != len(above):
        raise RuntimeError("gating partial gradients closed a cycle")
    position = [0] * len(above)
    for k, x in enumerate(order):
        position[x] = k
    return position


def _gate_nodes(nodes: list[onnx.NodeProto], planned: list[tuple[str, str, list[int]]]):
    """The node list with the gates of ``planned``: one per gradient tensor, reading it and every
    partial made from it, right before the first reader it holds back; those readers read the
    gate's first output (the tensor) instead."""
    by_tensor: dict[str, tuple[list[str], set[int]]] = {}
    for t, partial, others in planned:
        partials, readers = by_tensor.setdefault(t, ([], set()))
        partials.append(partial)
        readers.update(others)
    renamed: dict[int, dict[str, str]] = {}  # node position -> {tensor: the gate's output it reads}
    before: dict[int, list[onnx.NodeProto]] = {}
    for t, (partials, readers) in by_tensor.items():
        out = tags.partial_gate_tensor_name(t)
        gate = helper.make_node(
            "PassThrough",
            [t, *partials],
            [out, *(f"{out}/{k}" for k in range(1, len(partials) + 1))],
            name=tags.partial_gate_name(t),
            domain=MS_DOMAIN,
            doc_string=f"onnx-remat: the other readers of {t} wait for the partial gradients {', '.join(partials)}",
        )
        gate.metadata_props.add(key=tags.ROLE_KEY, value=tags.ROLE_PARTIAL_GATE)
        before.setdefault(min(readers), []).append(gate)
        for r in readers:
            renamed.setdefault(r, {})[t] = out
    rewired: list[onnx.NodeProto] = []
    for i, n in enumerate(nodes):
        rewired.extend(before.get(i, ()))
        names = renamed.get(i)
        if names is None:
            rewired.append(n)
            continue
        copy = onnx.NodeProto()
        copy.CopyFrom(n)
        for k, t in enumerate(copy.input):
            if t in names:
                copy.input[k] = names[t]
        rewired.append(copy)
    return rewired
