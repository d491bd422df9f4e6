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
are kept as they are in ``"inplace"`` mode: splitting them changes the Gemm's rounding for inner
dimensions above the kernel's block (measured: different bits from 256 up). In ``"early"`` mode
the other partial is accumulated first and the Gemm adds the *buffer* as its ``C`` (so on a step
with reset gradients it adds exactly the same values), then its result overwrites the buffer.

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
from onnx_remat.graph.conventions import MS_DOMAIN, parameter_of_buffer
from onnx_remat.graph.node_list import with_nodes
from onnx_remat.ortsim.graph import RuntimeGraph
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
    if mode == "sum":
        return AccumulationResult(model, [], [])
    nodes = list(model.graph.node)
    producer: dict[str, onnx.NodeProto] = {}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in nodes:
        for o in n.output:
            if o:
                producer[o] = n
        for t in n.input:
            if t:
                readers.setdefault(t, []).append(n)
    graph_outputs = {o.name for o in model.graph.output}
    when = {name: k for k, i in enumerate(order) for name in rg.at(i).origin}
    fused_into: dict[str, tuple[str, str, list[str]]] = {}  # Sum name -> (domain, op, inputs) of its fused node
    for r in rg.live():
        if len(r.origin) > 1:
            for name in r.origin:
                fused_into[name] = (r.domain, r.op, list(r.inputs))

    true_name = "onnx_remat/accumulate/overwrite"
    replace: dict[int, list[onnx.NodeProto]] = {}  # id(node) -> the nodes that stand in its place
    drop: set[int] = set()
    done: list[AccumulatedGradient] = []
    skipped: list[tuple[str, str]] = []
    for total in nodes:
        if total.op_type != "Sum" or total.domain not in ("", "ai.onnx") or len(total.input) < 2:
            continue
        out = total.output[0]
        users = readers.get(out, [])
        if len(users) != 1 or users[0].op_type != "InPlaceAccumulatorV2" or out in graph_outputs:
            continue
        acc = users[0]
        if list(acc.input[1:2]) != [out] or parameter_of_buffer(acc.input[0]) is None:
            continue
        param = parameter_of_buffer(acc.input[0]) or acc.input[0]
        partials = list(total.input)
        if len(set(partials)) != len(partials) or not all(partials):
            skipped.append((param, "a partial gradient appears twice in its sum"))
            continue
        fused = fused_into.get(total.name)
        gemm_c = None
        if fused is not None:
            if fused[:2] != ("", "Gemm") or len(fused[2]) < 3 or fused[2][2] not in partials or mode != "early":
                skipped.append((param, "onnxruntime fuses its sum into a Gemm: kept as written"))
                continue
            gemm_c = fused[2][2]
        # The first two partials may swap (a + b == b + a): the one that exists first goes first.
        if len(partials) >= 2 and gemm_c is None:
            inf = float("inf")
            first, second = partials[0], partials[1]
            if when.get(_made_by(producer, second), inf) < when.get(_made_by(producer, first), inf):
                partials[0], partials[1] = second, first
        if mode == "inplace":
            target = next((p for p in partials[:2] if _owns_buffer(p, producer, readers, total, graph_outputs)), None)
            if target is None:
                skipped.append((param, "no partial gradient owns its buffer (each is read elsewhere or an alias)"))
                continue
            if target != partials[0]:
                partials[0], partials[1] = partials[1], partials[0]
            new, record = _inplace_chain(total, acc, partials, param)
            replace[id(total)] = new
        else:
            new, record = _early_chain(total, acc, partials, param, gemm_c, true_name)
            replace[id(total)] = new
            drop.add(id(acc))
        done.append(record)
    if not done:
        return AccumulationResult(model, [], skipped)
    emitted: list[onnx.NodeProto] = []
    for n in nodes:
        if id(n) in drop:
            continue
        emitted.extend(replace.get(id(n), [n]))
    result = with_nodes(model, emitted)
    if mode == "early":
        result.graph.initializer.append(numpy_helper.from_array(np.array([True]), true_name))
    return AccumulationResult(result, done, skipped)


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
