"""Rewrite pass: the partial gradients of one parameter accumulated in place, not summed at the end.

Input: a training graph (``onnx.ModelProto``) and the graph onnxruntime runs of it
(:class:`~onnx_remat.ortsim.graph.RuntimeGraph`, to see which sums its optimizer fuses) with its
execution order. Output: an :class:`AccumulationResult` with a new ModelProto; the input is not
changed.

A parameter read by several nodes (tied input and output embeddings, a weight shared by two
layers) gets one partial gradient per reader; ``generate_artifacts``' gradient builder adds them
with one ``Sum`` (``AccumulateGrad_<param>_grad``) and hands the sum to the parameter's
``InPlaceAccumulatorV2`` (``GradientAccumulator<k>``, which copies it into the gradient buffer
when ``lazy_reset_grad`` is set, else adds it). Every partial lives until the last is made, and the
Sum's output joins them. Two modes:

* ``"inplace"`` (exact in every case): the Sum becomes a chain of ``com.microsoft::InPlaceAccumulator``
  nodes that add each partial into the first one's buffer, in the Sum's order. onnxruntime's CPU
  ``Sum`` adds its inputs left to right, one IEEE addition per element and input, and
  ``InPlaceAccumulator`` computes the same additions (the first two inputs may swap: a + b is
  b + a exactly), so every bit is the same, with gradients reset or accumulated across steps.
  Saves the Sum's output buffer. A partial is only written into when nothing else reads it and
  its buffer is its own (not an alias of another tensor).
* ``"early"`` (PyTorch's ``.grad +=``): each partial goes into the parameter's gradient buffer as
  soon as it exists: the first through the accumulator with ``lazy_reset_grad`` (a copy on a step
  with reset gradients), the others added to it; the buffer is a graph input, so no partial outlives
  its own accumulation and the sum never exists. On a step with reset gradients the result is
  bit-identical: the copy is exact and the additions are the Sum's, in its order. **Across steps
  without a reset it rounds differently**: the buffer becomes ``(b + p1) + p2`` where the
  gradient builder computes ``b + (p1 + p2)``, so gradient accumulation over several steps
  (``lazy_reset_grad`` false) can differ in the last bits. Hence it is an option, never the default.

Sums onnxruntime fuses into a ``Gemm`` (``GemmSumFusion``: the Gemm adds the other partial as its
``C``, inside the matrix product's own accumulation, e.g. the tied embedding's LM-head gradient)
cannot be split into a Gemm and an addition: that changes the Gemm's rounding for inner dimensions
above the kernel's block (measured: different bits from 256 up). Where that ``C`` is an
embedding's ``GatherGrad`` (the tied input and output embedding of a decoder LM: two dense
parameter-sized partials alive together at the end of the backward pass, the graph's peak),
``"inplace"`` mode writes the fused Gemm in a form that rounds the same and never holds two dense
partials: the Gemm's rows where ``C`` is zero go into the buffer as soon as the LM head's
gradient exists, and its rows for the token ids that occur are computed as onnxruntime computes
them, with ``C`` restricted to those rows, and added at the end (:func:`_sparse_gemm_chain`).
Other fused sums are kept as they are in ``"inplace"`` mode. In ``"early"`` mode the other
partial is accumulated first and the Gemm adds the *buffer* as its ``C`` (so on a step with reset
gradients it adds exactly the same values), then its result overwrites the buffer.

Only sums whose one reader is the parameter's ``InPlaceAccumulatorV2`` are touched: the gradients
of activations stay as written. Linear in nodes + edges.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_remat.graph import tags
from onnx_remat.graph.conventions import ACCUMULATOR_OPS, MS_DOMAIN, parameter_of_buffer
from onnx_remat.graph.node_list import with_nodes
from onnx_remat.ortsim.graph import RuntimeGraph, RuntimeNode
from onnx_remat.ortsim.kernels import alias_input

MODES = ("sum", "inplace", "early")


@dataclass
class AccumulatedGradient:
    """What the pass did with one parameter's gradient sum."""

    parameter: str
    partials: list[str]  # the partial gradients, in the order they are accumulated
    mode: str  # "inplace" or "early"
    fused_gemm: bool = False  # the sum is a Gemm's C in onnxruntime's graph (early mode keeps it so)
    nodes: list[str] = field(default_factory=list)  # names of the nodes added

    def to_json(self) -> dict:
        return {
            "parameter": self.parameter,
            "partials": self.partials,
            "mode": self.mode,
            "fused_gemm": self.fused_gemm,
            "nodes": self.nodes,
        }


@dataclass
class AccumulationResult:
    model: onnx.ModelProto
    gradients: list[AccumulatedGradient]
    skipped: list[tuple[str, str]]  # (parameter, why)


_TRUE_NAME = "onnx_remat/accumulate/overwrite"  # the [True] initializer early mode's last accumulator reads


def accumulate_gradients(
    model: onnx.ModelProto, rg: RuntimeGraph, order: Sequence[int], mode: str = "inplace"
) -> AccumulationResult:
    """Rewrite ``model``'s parameter gradient sums in ``mode`` (see the module docstring).

    ``rg`` is the graph onnxruntime runs of ``model`` and ``order`` its execution order (node
    indices), used to see which sums it fuses into a Gemm and which partial exists first.
    ``mode="sum"`` returns the model as it is.
    """
    if mode not in MODES:
        raise ValueError(f"unknown gradient accumulation mode {mode!r}")
    if mode == "sum" or not may_have_parameter_sums(model):
        return AccumulationResult(model, [], [])
    graph = _SumGraph(model, rg, order)
    edits = _Edits()
    done: list[AccumulatedGradient] = []
    skipped: list[tuple[str, str]] = []
    for total in graph.nodes:
        found = graph.parameter_sum(total)
        if found is None:
            continue
        acc, param = found
        outcome = _rewrite_sum(total, acc, param, mode, graph, edits)
        if isinstance(outcome, str):
            skipped.append((param, outcome))
        else:
            done.append(outcome)
    if not done:
        return AccumulationResult(model, [], skipped)
    return AccumulationResult(_rewritten_model(model, mode, graph, edits), done, skipped)


# What may stand between a parameter's gradient Sum and its accumulator (a weight transposed once
# for every call has its gradient transposed back: scheduling/partials.py reads such sums too).
PASSING_OPS = frozenset({"Transpose", "Reshape", "Identity", "Cast"})


def may_have_parameter_sums(model: onnx.ModelProto) -> bool:
    """Whether some ``Sum`` of two or more partials reaches an ``InPlaceAccumulatorV2``-like
    accumulator's value input, directly or through :data:`PASSING_OPS` alone: only then can this
    pass or :mod:`~onnx_remat.scheduling.partials` find a parameter's gradient sum. One read of
    each node's op type (0.1 s at 10^5 nodes, where the graph either pass reads costs 0.5-0.7 s
    to build), and most graphs have no shared parameter (their activations' gradient sums reach
    no accumulator)."""
    sums: set[str] = set()
    values: list[str] = []
    passing: dict[str, str] = {}
    for n in model.graph.node:
        op = n.op_type
        if op == "Sum":
            if len(n.input) >= 2 and n.output:
                sums.add(n.output[0])
        elif op in ACCUMULATOR_OPS:
            if len(n.input) > 1:
                values.append(n.input[1])
        elif op in PASSING_OPS and n.input and n.output:
            passing[n.output[0]] = n.input[0]
    for t in values:
        for _ in range(len(PASSING_OPS) + 1):
            if t in sums:
                return True
            if t not in passing:
                break
            t = passing[t]
    return False


class _SumGraph:
    """What the pass reads of the graph: its nodes, each tensor's producer and readers, the graph
    outputs, when onnxruntime runs each node (``when``: node name -> position in its order) and
    the node its optimizer fused each fused node into (``fused_into``: node name -> that node)."""

    def __init__(self, model: onnx.ModelProto, rg: RuntimeGraph, order: Sequence[int]):
        self.rg = rg
        self.nodes = list(model.graph.node)
        self.producer: dict[str, onnx.NodeProto] = {}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for n in self.nodes:
            for o in n.output:
                if o:
                    self.producer[o] = n
            for t in n.input:
                if t:
                    self.readers.setdefault(t, []).append(n)
        self.graph_outputs = {o.name for o in model.graph.output}
        self.when = {name: k for k, i in enumerate(order) for name in rg.at(i).origin}
        self.fused_into: dict[str, RuntimeNode] = {}  # Sum name -> the node onnxruntime fused it into
        for r in rg.live():
            if len(r.origin) > 1:
                for name in r.origin:
                    self.fused_into[name] = r

    def parameter_sum(self, total: onnx.NodeProto) -> tuple[onnx.NodeProto, str] | None:
        """The accumulator and the parameter where ``total`` is a parameter's gradient sum the pass
        rewrites: a ``Sum`` of two or more partials whose one reader is the parameter's
        ``InPlaceAccumulatorV2`` (and no graph output)."""
        if total.op_type != "Sum" or total.domain not in ("", "ai.onnx") or len(total.input) < 2:
            return None
        out = total.output[0]
        users = self.readers.get(out, [])
        if len(users) != 1 or users[0].op_type != "InPlaceAccumulatorV2" or out in self.graph_outputs:
            return None
        acc = users[0]
        if list(acc.input[1:2]) != [out] or parameter_of_buffer(acc.input[0]) is None:
            return None
        return acc, parameter_of_buffer(acc.input[0]) or acc.input[0]


@dataclass
class _Edits:
    """What the pass changes, gathered until the new node list is written."""

    replace: dict[int, list[onnx.NodeProto]] = field(default_factory=dict)  # id(node) -> the nodes in its place
    drop: set[int] = field(default_factory=set)  # id(node) of nodes removed
    unread: list[onnx.NodeProto] = field(default_factory=list)  # nodes no longer read (removed if dead)
    constants: dict[str, onnx.TensorProto] = field(default_factory=dict)
    infos: list[onnx.ValueInfoProto] = field(default_factory=list)


def _rewrite_sum(
    total: onnx.NodeProto, acc: onnx.NodeProto, param: str, mode: str, graph: _SumGraph, edits: _Edits
) -> AccumulatedGradient | str:
    """Rewrite the gradient sum ``total`` of ``param`` (read by ``acc``) in ``mode`` into ``edits``;
    returns what was done, or why the sum is kept as written."""
    partials = list(total.input)
    if len(set(partials)) != len(partials) or not all(partials):
        return "a partial gradient appears twice in its sum"
    fused = graph.fused_into.get(total.name)
    gemm_c = None
    if fused is not None:
        fused_c = fused.inputs[2] if fused.key == ("", "Gemm") and len(fused.inputs) > 2 else None
        if mode == "inplace" and fused_c is not None and fused_c in partials:
            return _split_fused_gemm(total, acc, param, fused, fused_c, partials, graph, edits)
        if fused_c is None or fused_c not in partials or mode != "early":
            return "onnxruntime fuses its sum into a Gemm: kept as written"
        gemm_c = fused_c
    # The first two partials may swap (a + b == b + a): the one that exists first goes first.
    if len(partials) >= 2 and gemm_c is None:
        inf = float("inf")
        first, second = partials[0], partials[1]
        if graph.when.get(_made_by(graph.producer, second), inf) < graph.when.get(_made_by(graph.producer, first), inf):
            partials[0], partials[1] = second, first
    if mode == "inplace":
        owns = (p for p in partials[:2] if _owns_buffer(p, graph.producer, graph.readers, total, graph.graph_outputs))
        target = next(owns, None)
        if target is None:
            return "no partial gradient owns its buffer (each is read elsewhere or an alias)"
        if target != partials[0]:
            partials[0], partials[1] = partials[1], partials[0]
        new, record = _inplace_chain(total, acc, partials, param)
        edits.replace[id(total)] = new
    else:
        new, record = _early_chain(total, acc, partials, param, gemm_c, _TRUE_NAME)
        edits.replace[id(total)] = new
        edits.drop.add(id(acc))
    return record


def _split_fused_gemm(
    total: onnx.NodeProto,
    acc: onnx.NodeProto,
    param: str,
    fused: RuntimeNode,
    fused_c: str,
    partials: list[str],
    graph: _SumGraph,
    edits: _Edits,
) -> AccumulatedGradient | str:
    """``inplace`` mode on a sum onnxruntime fuses into a Gemm as its ``C`` (partial ``fused_c``):
    the sparse split of :func:`_sparse_gemm_chain`, or why it is kept as written."""
    why = _sparse_split_refusal(fused, fused_c, partials, graph.producer, graph.readers, graph.rg, graph.graph_outputs)
    if why is not None:
        return f"onnxruntime fuses its sum into a Gemm: kept as written ({why})"
    new, record = _sparse_gemm_chain(
        total, acc, param, fused, graph.producer[fused_c], graph.rg, edits.constants, edits.infos
    )
    edits.replace[id(total)] = new
    edits.drop.add(id(acc))
    edits.unread += [graph.producer[t] for t in partials if t in graph.producer]
    return record


def _rewritten_model(model: onnx.ModelProto, mode: str, graph: _SumGraph, edits: _Edits) -> onnx.ModelProto:
    """``model`` with ``edits``: the node list rewritten (dead nodes left out), constants and value
    infos added."""
    emitted: list[onnx.NodeProto] = []
    for n in graph.nodes:
        if id(n) in edits.drop:
            continue
        emitted.extend(edits.replace.get(id(n), [n]))
    emitted = _without_dead(emitted, edits.unread, graph.graph_outputs)
    result = with_nodes(model, emitted)
    if mode == "early":
        result.graph.initializer.append(numpy_helper.from_array(np.array([True]), _TRUE_NAME))
    result.graph.initializer.extend(edits.constants.values())
    result.graph.value_info.extend(edits.infos)
    return result


def _without_dead(
    nodes: list[onnx.NodeProto], candidates: list[onnx.NodeProto], graph_outputs: set[str]
) -> list[onnx.NodeProto]:
    """``nodes`` without the ``candidates`` that nothing reads any more, and without what only they
    read (walked upstream from them alone: the rest of the graph is left as it was written)."""
    if not candidates:
        return nodes
    producer = {o: n for n in nodes for o in n.output if o}
    readers: dict[str, int] = {}
    for n in nodes:
        for t in n.input:
            if t:
                readers[t] = readers.get(t, 0) + 1
    dead: set[int] = set()
    work = list(candidates)
    while work:
        n = work.pop()
        if id(n) in dead or any(readers.get(o, 0) or o in graph_outputs for o in n.output if o):
            continue
        dead.add(id(n))
        for t in n.input:
            if t:
                readers[t] -= 1
                if readers[t] == 0 and t in producer:
                    work.append(producer[t])
    return [n for n in nodes if id(n) not in dead]


def _made_by(producer: dict[str, onnx.NodeProto], tensor: str) -> str:
    p = producer.get(tensor)
    return p.name if p is not None else ""


def _owns_buffer(
    tensor: str,
    producer: dict[str, onnx.NodeProto],
    readers: dict[str, list[onnx.NodeProto]],
    total: onnx.NodeProto,
    graph_outputs: set[str],
) -> bool:
    """``tensor`` may be written in place: made by a node (not an input), not an alias of one of
    that node's inputs, read by ``total`` alone (once), and no graph output."""
    p = producer.get(tensor)
    if p is None or tensor in graph_outputs:
        return False
    k = list(p.output).index(tensor)
    if alias_input(p.domain, p.op_type, k, len(p.input)) is not None:
        return False
    users = readers.get(tensor, [])
    return len(users) == 1 and users[0] is total and list(total.input).count(tensor) == 1


def _tag(node: onnx.NodeProto, doc: str) -> None:
    node.doc_string = doc
    entry = node.metadata_props.add()
    entry.key, entry.value = tags.ROLE_KEY, tags.ROLE_ACCUMULATE


def _inplace_chain(
    total: onnx.NodeProto, acc: onnx.NodeProto, partials: list[str], param: str
) -> tuple[list[onnx.NodeProto], AccumulatedGradient]:
    """``InPlaceAccumulator(p1, p2)``, then ``(.., p3)``, ...; the last writes the Sum's output."""
    new: list[onnx.NodeProto] = []
    running = partials[0]
    for k, p in enumerate(partials[1:], start=1):
        last = k == len(partials) - 1
        out = total.output[0] if last else tags.accumulate_tensor_name(partials[0], k)
        node = helper.make_node(
            "InPlaceAccumulator",
            [running, p],
            [out],
            name=tags.accumulate_name(param, k),
            domain=MS_DOMAIN,
        )
        _tag(node, f"onnx-remat: adds partial gradient {p} of {param} into {partials[0]} in place ({total.name})")
        new.append(node)
        running = out
    return new, AccumulatedGradient(param, partials, "inplace", nodes=[n.name for n in new])


def _early_chain(
    total: onnx.NodeProto,
    acc: onnx.NodeProto,
    partials: list[str],
    param: str,
    gemm_c: str | None,
    true_name: str,
) -> tuple[list[onnx.NodeProto], AccumulatedGradient]:
    """Each partial into the gradient buffer as it exists; the accumulator's own outputs last."""
    buffer, reset = acc.input[0], (acc.input[2] if len(acc.input) > 2 else "")
    new: list[onnx.NodeProto] = []
    running = buffer
    if gemm_c is not None:
        # onnxruntime fuses Sum(gemm, C) into Gemm(C=...): C is accumulated first, then the Sum
        # (fused again) adds the buffer, and its result overwrites the buffer.
        gemm_side = [p for p in partials if p != gemm_c]
        partials = [gemm_c, *gemm_side]
        step = _accumulator(param, 1, running, gemm_c, reset, buffer)
        new += [step, _anchor(step)]
        running = step.output[1]
        kept_sum = helper.make_node("Sum", [*gemm_side, running], list(total.output), name=total.name)
        _tag(kept_sum, f"onnx-remat: {total.name} adds the gradient buffer (holding {gemm_c}) instead of {gemm_c}")
        new.append(kept_sum)
        inputs = [running, total.output[0], true_name]
        last = helper.make_node("InPlaceAccumulatorV2", inputs, list(acc.output), name=acc.name, domain=MS_DOMAIN)
        _tag(last, f"onnx-remat: writes the sum into the gradient buffer of {param}")
        new.append(last)
        return new, AccumulatedGradient(param, partials, "early", fused_gemm=True, nodes=[n.name for n in new[:2]])
    for k, p in enumerate(partials, start=1):
        if k == len(partials):
            step = helper.make_node(
                "InPlaceAccumulatorV2", [running, p], list(acc.output), name=acc.name, domain=MS_DOMAIN
            )
            _tag(step, f"onnx-remat: adds partial gradient {p} into the gradient buffer of {param}")
            new.append(step)
        else:
            step = _accumulator(param, k, running, p, reset if k == 1 else "", buffer)
            new += [step, _anchor(step)]
            running = step.output[1]
    return new, AccumulatedGradient(param, partials, "early", nodes=[n.name for n in new[:-1]])


def _accumulator(param: str, k: int, buffer: str, value: str, reset: str, original_buffer: str) -> onnx.NodeProto:
    inputs = [buffer, value] + ([reset] if reset else [])
    node = helper.make_node(
        "InPlaceAccumulatorV2",
        inputs,
        [tags.accumulate_tensor_name(original_buffer, k) + "/updated", tags.accumulate_tensor_name(original_buffer, k)],
        name=tags.accumulate_name(param, k),
        domain=MS_DOMAIN,
    )
    how = "copies (gradients reset) or adds" if reset else "adds"
    _tag(node, f"onnx-remat: {how} partial gradient {value} into the gradient buffer of {param} as soon as it exists")
    return node


def _anchor(step: onnx.NodeProto) -> onnx.NodeProto:
    """A ``PassThrough`` of ``step``'s one-byte flag whose output nothing reads: a *leaf*.

    onnxruntime's DEFAULT order runs a node when it walks the cone of the first leaf that needs
    it; an accumulation step's only reader is the next step, so without a leaf of its own it would
    wait for the last partial, and with it the partial it adds. The anchor is a leaf the scheduler
    can rank to run right after the partial exists (:mod:`onnx_remat.scheduling.realize`).
    """
    node = helper.make_node(
        "PassThrough", [step.output[0]], [step.output[0] + "/anchor"], name=step.name + "/anchor", domain=MS_DOMAIN
    )
    _tag(node, f"onnx-remat: lets the execution order run {step.name} as soon as its partial gradient exists")
    return node


def _sparse_split_refusal(
    gemm: RuntimeNode,
    c: str,
    partials: list[str],
    producer: dict[str, onnx.NodeProto],
    readers: dict[str, list[onnx.NodeProto]],
    rg: RuntimeGraph,
    graph_outputs: set[str],
) -> str | None:
    """Why the fused Gemm ``gemm`` (``C`` = partial ``c``) cannot take :func:`_sparse_gemm_chain`'s
    form, or None when it can: ``c`` is a ``GatherGrad`` read by the sum alone, the sum has two
    partials, and the Gemm's operands are tensors of the model as written, in float32."""
    sparse = producer.get(c)
    if len(partials) != 2:
        return "more than two partial gradients"
    if sparse is None or sparse.op_type != "GatherGrad" or sparse.domain != MS_DOMAIN or len(sparse.input) < 3:
        return "its C is not an embedding's GatherGrad"
    if len(readers.get(c, [])) != 1 or c in graph_outputs:
        return "the GatherGrad's output is read elsewhere"
    if any(att.name == "axis" and att.i != 0 for att in sparse.attribute):
        return "the GatherGrad gathers along another axis than 0"
    a, b = gemm.inputs[0], gemm.inputs[1]
    known = set(producer) | set(rg.graph_inputs) | set(rg.initializers)
    if a not in known or b not in known:
        return "the Gemm reads tensors onnxruntime's optimizer made"
    if rg.sizes.elem_type(a) != onnx.TensorProto.FLOAT or rg.sizes.elem_type(c) != onnx.TensorProto.FLOAT:
        return "not float32"
    if rg.sizes.raw_dims(c) is None or len(rg.sizes.raw_dims(c) or ()) != 2 or rg.sizes.raw_dims(a) is None:
        return "the shapes are not known"
    return None


def _constant(constants: dict[str, onnx.TensorProto], name: str, value) -> str:
    if name not in constants:
        constants[name] = numpy_helper.from_array(np.asarray(value), name)
    return name


def _sparse_gemm_chain(
    total: onnx.NodeProto,
    acc: onnx.NodeProto,
    param: str,
    gemm: RuntimeNode,
    sparse: onnx.NodeProto,
    rg: RuntimeGraph,
    constants: dict[str, onnx.TensorProto],
    infos: list[onnx.ValueInfoProto],
) -> tuple[list[onnx.NodeProto], AccumulatedGradient]:
    """The exact in-place form of ``Gemm(a, b, C=GatherGrad(shape, ids, dE))`` into the gradient
    buffer (module docstring). With ``u`` the token ids that occur (``Unique``):

    1. ``P = Gemm(a * keep, b)``, ``keep`` 0 on the rows ``u`` (of the Gemm's output) and 1 elsewhere:
       outside ``u``, where ``C`` is zero, the same sums as onnxruntime's Gemm (``0 + x`` is
       ``x``), and zeros on ``u``. It goes into the buffer as soon as it exists
       (``InPlaceAccumulatorV2`` with the reset flag: a copy, or the addition ``buffer + P``
       onnxruntime makes as ``buffer + Y`` there);
    2. ``Y_u = Gemm(a[u], b, C=GatherGrad([|u|, n], inverse ids, dE))``: onnxruntime's Gemm on the
       rows ``u`` (the same ``C`` rows, summed by the same kernel in the same order, only renumbered;
       the same inner products, whose blocking depends on the inner and column sizes, not the rows);
    3. ``D = GatherGrad(shape, u, Y_u)``: dense, ``Y_u`` on the rows ``u`` (``0 + y``), zeros
       elsewhere, added to the buffer last (never a reset: ``(buffer + 0) + y``).

    Each element of the buffer gets onnxruntime's additions, with gradients reset or accumulated,
    and at most one parameter-sized partial exists at a time.
    """
    a, b = gemm.inputs[0], gemm.inputs[1]
    trans_a, trans_b = int(gemm.attrs.get("transA", 0)), int(gemm.attrs.get("transB", 0))
    alpha, beta = float(gemm.attrs.get("alpha", 1.0)), float(gemm.attrs.get("beta", 1.0))
    shape, ids, d_embed = sparse.input[0], sparse.input[1], sparse.input[2]
    buffer, reset = acc.input[0], (acc.input[2] if len(acc.input) > 2 else "")
    prefix = f"{tags.ACCUMULATE_PREFIX}{param}"

    def name(s: str) -> str:
        return f"{prefix}/{s}"

    minus_one = _constant(constants, f"{tags.ACCUMULATE_PREFIX}minus_one", np.array([-1], dtype=np.int64))
    zero = _constant(constants, f"{tags.ACCUMULATE_PREFIX}zero", np.array([0], dtype=np.int64))
    one = _constant(constants, f"{tags.ACCUMULATE_PREFIX}one", np.array([1], dtype=np.int64))
    end = _constant(constants, f"{tags.ACCUMULATE_PREFIX}int_max", np.array([np.iinfo(np.int64).max], dtype=np.int64))
    never = _constant(constants, f"{tags.ACCUMULATE_PREFIX}add", np.array([False]))
    row_axis = 1 if trans_a else 0  # the axis of ``a`` that indexes the rows of the Gemm's output

    def node(op: str, inputs: list[str], outputs: list[str], step: str, domain: str = "", **attrs) -> onnx.NodeProto:
        return helper.make_node(op, inputs, outputs, name=name(step), domain=domain, **attrs)

    nodes = [
        node("Reshape", [ids, minus_one], [name("ids")], "flatten_ids"),
        node("Unique", [name("ids")], [name("u"), "", name("inverse"), ""], "unique", sorted=1),
        node("Shape", [ids], [name("ids_shape")], "ids_shape"),
        node("Reshape", [name("inverse"), name("ids_shape")], [name("inverse_ids")], "inverse_ids"),
        node("Shape", [name("u")], [name("u_count")], "u_count"),
        node("Slice", [shape, one, end], [name("row_shape")], "row_shape"),
        node("Concat", [name("u_count"), name("row_shape")], [name("rows_shape")], "rows_shape", axis=0),
        node("GatherGrad", [name("rows_shape"), name("inverse_ids"), d_embed], [name("c_rows")], "c_rows", MS_DOMAIN),
        node("Gather", [a, name("u")], [name("a_rows")], "a_rows", axis=row_axis),
        node(
            "Gemm",
            [name("a_rows"), b, name("c_rows")],
            [name("y_rows")],
            "y_rows",
            transA=trans_a,
            transB=trans_b,
            alpha=alpha,
            beta=beta,
        ),
        node("Slice", [shape, zero, one], [name("row_count")], "row_count"),
        node("ConstantOfShape", [name("row_count")], [name("ones")], "ones", value=_float_tensor(1.0)),
        node("ConstantOfShape", [name("u_count")], [name("zeros")], "zeros", value=_float_tensor(0.0)),
        node("ScatterElements", [name("ones"), name("u"), name("zeros")], [name("keep")], "keep", axis=0),
    ]
    keep = name("keep")
    if row_axis == 0:  # ``a`` is [rows, inner]: keep as a column
        nodes.append(node("Unsqueeze", [keep, minus_one], [name("keep_column")], "keep_column"))
        keep = name("keep_column")
    nodes += [
        node("Mul", [a, keep], [name("a_kept")], "a_kept"),
        node("Gemm", [name("a_kept"), b], [name("dense")], "dense", transA=trans_a, transB=trans_b, alpha=alpha),
    ]
    step = _accumulator(param, 1, buffer, name("dense"), reset, buffer)
    nodes += [step, _anchor(step)]
    nodes += [
        node("GatherGrad", [shape, name("u"), name("y_rows")], [name("rows_dense")], "rows_dense", MS_DOMAIN),
        helper.make_node(
            "InPlaceAccumulatorV2",
            [step.output[1], name("rows_dense"), never],
            list(acc.output),
            name=acc.name,
            domain=MS_DOMAIN,
        ),
    ]
    for n in nodes:
        if not n.doc_string:
            _tag(n, f"onnx-remat: the tied gradient of {param} ({total.name}, a Gemm in onnxruntime), in place")
    # onnxruntime infers neither GatherGrad's output shape from a computed shape nor Unique's:
    # the parameter-sized tensors are declared, as generate_artifacts declares its gradients.
    param_dims = rg.sizes.raw_dims(total.output[0]) or rg.sizes.raw_dims(sparse.output[0])
    a_dims = rg.sizes.raw_dims(a)
    for t, dims in ((name("dense"), param_dims), (name("rows_dense"), param_dims), (name("a_kept"), a_dims)):
        if dims is not None:
            infos.append(helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, list(dims)))
    return nodes, AccumulatedGradient(
        param, [name("dense"), name("rows_dense")], "inplace", fused_gemm=True, nodes=[n.name for n in nodes]
    )


def _float_tensor(value: float) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array([value], dtype=np.float32), "value")
