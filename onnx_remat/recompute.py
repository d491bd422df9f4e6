"""Rewrite pass: clone each segment's forward nodes into the backward pass, behind a barrier.

Input: a :class:`~onnx_remat.training_graph.TrainingGraph` and a
:class:`~onnx_remat.selection.RecomputePlan` built on it. Output: a :class:`RewriteResult` with a new
``onnx.ModelProto``; the input ModelProto is not modified (the TrainingGraph's graphsurgeon graph
is, so analyse again before rewriting again).

For every segment the pass

1. clones the segment's nodes (a training-mode ``Dropout`` becomes a replay from its stored mask,
   see :mod:`onnx_remat.random_ops`) and points every backward reader of a target at its clone,
   so the original forward tensor is freed as soon as the forward pass is done with it;
2. adds one *barrier*, ``com.microsoft::PassThrough``, whose inputs are every tensor the clones
   read from storage plus the *trigger* (the gradient tensors the segment's first backward reader
   consumes) and whose outputs alias its inputs (zero copy). The clones read those outputs. So a
   clone cannot run before the backward pass reaches its segment, and its inputs differ from the
   original node's, which keeps onnxruntime's common-subexpression elimination from merging it
   back (both measured on onnxruntime 1.19.2, ../shared/notes/ort-1.19.md);
3. places barrier and clones in the node list right before the segment's first backward reader:
   onnxruntime's DEFAULT execution order follows the node list closely enough that they then run
   just in time (appended at the end they run ~50 kernels early).

Guarantees, checked after the rewrite (:meth:`RecomputeRewrite.ensures`): the node list is in
topological order; no target is read by a backward node any more; every clone reads at least one
barrier output or another clone of its segment; names of added nodes and tensors are unique.
Clones and barriers are named and tagged as :mod:`onnx_remat.tags` describes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import onnx
import onnx_graphsurgeon as gs

from . import __version__, tags
from .random_ops import is_replayable, replay_inputs
from .selection import RecomputePlan, Segment
from .training_graph import TrainingGraph, producer

MS_DOMAIN = "com.microsoft"


@dataclass
class RewrittenSegment:
    """What the rewrite did for one segment."""

    segment: Segment
    label: str
    barrier: str | None
    triggers: list[str]
    clones: list[str]
    first_consumer: str
    rewired_inputs: int
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        data = self.segment.summary()
        data.update(
            label=self.label,
            barrier=self.barrier,
            triggers=self.triggers,
            clones=self.clones,
            first_consumer=self.first_consumer,
            rewired_inputs=self.rewired_inputs,
            notes=self.segment.notes + self.notes,
        )
        return data


@dataclass
class RewriteResult:
    """The rewritten model and, per segment, what was added."""

    model: onnx.ModelProto
    segments: list[RewrittenSegment]

    @property
    def clone_count(self) -> int:
        return sum(len(s.clones) for s in self.segments)


class RecomputeRewrite:
    """The recompute rewrite pass. ``RecomputeRewrite()(tg, plan)`` returns a :class:`RewriteResult`.

    ``barrier=False`` and ``replay_dropout=False`` produce the naive rewrites that the tests use
    to show what the barrier and the dropout replay protect against; don't use them otherwise.
    """

    def __init__(self, *, barrier: bool = True, replay_dropout: bool = True):
        self.barrier = barrier
        self.replay_dropout = replay_dropout

    def __call__(self, tg: TrainingGraph, plan: RecomputePlan) -> RewriteResult:
        self.requires(tg, plan)
        result = self.call(tg, plan)
        self.ensures(tg, result)
        return result

    # -- preconditions -------------------------------------------------------------------------

    def requires(self, tg: TrainingGraph, plan: RecomputePlan) -> None:
        """The graph has not been rewritten by onnx-remat before, and the plan has segments."""
        from .errors import RematError

        already = [n.name for n in tg.order if tags.is_clone_name(n.name) or tags.is_barrier_name(n.name)]
        if already:
            raise RematError(
                f"this graph was already rewritten by onnx-remat ({len(already)} recompute nodes, e.g. "
                f"{already[0]!r}); apply onnx-remat to the original training graph"
            )
        if not plan.segments:
            raise RematError("nothing to recompute: " + "; ".join(s.reason for s in plan.skipped) if plan.skipped
                             else "nothing to recompute")

    # -- the work ------------------------------------------------------------------------------

    def call(self, tg: TrainingGraph, plan: RecomputePlan) -> RewriteResult:
        graph = tg.graph
        labels = _unique_labels([s.label for s in plan.segments])
        # Triggers and readers are read off the original graph before any edge changes.
        staged = [(seg, label, *self._readers_and_triggers(tg, seg)) for seg, label in zip(plan.segments, labels)]

        insert_before: dict[int, list[gs.Node]] = {}
        done: list[RewrittenSegment] = []
        for seg, label, readers, triggers, notes in staged:
            added, rewritten = self._rewrite_segment(tg, seg, label, readers, triggers)
            rewritten.notes.extend(notes)
            insert_before.setdefault(id(readers[0]), []).extend(added)
            done.append(rewritten)

        nodes: list[gs.Node] = []
        for node in tg.order:
            nodes.extend(insert_before.get(id(node), ()))
            nodes.append(node)
        graph.nodes = nodes

        plan_json = json.dumps([s.summary() for s in done], sort_keys=True)
        model = tg.mg.to_model(
            extra_opsets={MS_DOMAIN: 1},
            metadata={tags.PLAN_KEY: plan_json, tags.VERSION_KEY: __version__},
        )
        return RewriteResult(model=model, segments=done)

    def _readers_and_triggers(self, tg: TrainingGraph, seg: Segment):
        readers: dict[int, gs.Node] = {}
        for t in seg.targets:
            for n in tg.backward_consumers(t):
                readers[id(n)] = n
        ordered = sorted(readers.values(), key=lambda n: tg.position[id(n)])
        notes: list[str] = []
        for reader in ordered:
            triggers = _unique([t for t in reader.inputs if t.name and producer(t) is not None and tg.is_backward(producer(t))])
            if triggers:
                return ordered, triggers, notes
        if tg.seed is not None:
            notes.append("no gradient input reaches this segment's readers first: the loss gradient seed is the trigger")
            return ordered, [tg.seed], notes
        notes.append("no trigger found: clones may run early")
        return ordered, [], notes

    def _rewrite_segment(self, tg, seg: Segment, label: str, readers, triggers):
        gated: dict[str, gs.Tensor] = {}
        gate_order: list[gs.Tensor] = []

        def gate(t: gs.Tensor) -> gs.Tensor:
            if not self.barrier:
                return t
            out = gated.get(t.name)
            if out is None:
                out = gs.Variable(tags.gate_tensor_name(t.name, label), dtype=t.dtype, shape=t.shape)
                gated[t.name] = out
                gate_order.append(t)
            return out

        clone_of: dict[str, gs.Tensor] = {}

        def source(t: gs.Tensor) -> gs.Tensor:
            if not t.name or isinstance(t, gs.Constant):
                return t  # omitted optional input or initializer: read directly
            return clone_of.get(t.name) or gate(t)

        clones: list[gs.Node] = []
        for index, node in enumerate(seg.recompute):
            name = tags.clone_name(node.name, node.op, index)
            if self.replay_dropout and is_replayable(node):
                inputs = [source(t) for t in replay_inputs(node, node.inputs[0])]
                out = node.outputs[0]
                outputs = [gs.Variable(tags.clone_tensor_name(out.name), dtype=out.dtype, shape=out.shape)]
                clone = gs.Node(op="DropoutGrad", name=name, domain=MS_DOMAIN, inputs=inputs, outputs=outputs)
                what = f"replays Dropout {node.name} from its stored mask"
            else:
                outputs = [
                    gs.Variable(tags.clone_tensor_name(o.name), dtype=o.dtype, shape=o.shape) if o.name else gs.Variable.empty()
                    for o in node.outputs
                ]
                clone = gs.Node(
                    op=node.op,
                    name=name,
                    domain=node.domain,
                    attrs=dict(node.attrs),
                    inputs=[source(t) for t in node.inputs],
                    outputs=outputs,
                )
                what = f"recomputes {node.name or node.op}"
            for orig, new in zip(node.outputs, outputs):
                if orig.name and new.name:
                    clone_of[orig.name] = new
            metadata = dict(tg.mg.extras(node).metadata)
            metadata.update({tags.ROLE_KEY: tags.ROLE_CLONE, tags.SEGMENT_KEY: label, tags.SOURCE_KEY: node.name})
            tg.mg.set_extras(clone, f"onnx-remat clone: {what} for the backward pass (segment {label})", metadata)
            clones.append(clone)

        rewired = 0
        target_names = {t.name for t in seg.targets}
        for reader in readers:
            for i, t in enumerate(reader.inputs):
                if t.name in target_names:
                    reader.inputs[i] = clone_of[t.name]
                    rewired += 1

        added: list[gs.Node] = []
        barrier_name = None
        if self.barrier:
            barrier_name = tags.barrier_name(label)
            pass_inputs = gate_order + triggers
            pass_outputs = [gated[t.name] for t in gate_order] + [
                gs.Variable(tags.gate_tensor_name(t.name, label), dtype=t.dtype, shape=t.shape) for t in triggers
            ]
            barrier = gs.Node(op="PassThrough", name=barrier_name, domain=MS_DOMAIN, inputs=pass_inputs, outputs=pass_outputs)
            trigger_names = ", ".join(t.name for t in triggers) or "nothing"
            tg.mg.set_extras(
                barrier,
                f"onnx-remat barrier of segment {label}: passes the clones' stored inputs through (zero copy) once "
                f"{trigger_names} exists, so the clones run when the backward pass reaches the segment and are "
                "not merged back into the forward nodes",
                {tags.ROLE_KEY: tags.ROLE_BARRIER, tags.SEGMENT_KEY: label},
            )
            added.append(barrier)
        added.extend(clones)
        rewritten = RewrittenSegment(
            segment=seg,
            label=label,
            barrier=barrier_name,
            triggers=[t.name for t in triggers] if self.barrier else [],
            clones=[c.name for c in clones],
            first_consumer=readers[0].name,
            rewired_inputs=rewired,
        )
        return added, rewritten

    # -- postconditions ------------------------------------------------------------------------

    def ensures(self, tg: TrainingGraph, result: RewriteResult) -> None:
        """Check the guarantees in the module docstring on the rewritten graph; raise on violation."""
        nodes = tg.graph.nodes
        produced_at: dict[str, int] = {}
        names: set[str] = set()
        for i, node in enumerate(nodes):
            for out in node.outputs:
                if out.name:
                    if out.name in produced_at:
                        raise RuntimeError(f"rewrite produced tensor {out.name!r} twice")
                    produced_at[out.name] = i
        for i, node in enumerate(nodes):
            for t in node.inputs:
                if t.name in produced_at and produced_at[t.name] >= i:
                    raise RuntimeError(f"rewrite broke the topological order at node {node.name!r}")
            if tags.is_clone_name(node.name) or tags.is_barrier_name(node.name):
                if node.name in names:
                    raise RuntimeError(f"rewrite produced node name {node.name!r} twice")
                names.add(node.name)
        for seg in result.segments:
            for t in seg.segment.targets:
                still = [n.name for n in t.outputs if tg.is_backward(n)]
                if still:
                    raise RuntimeError(f"{t.name} is still read by backward nodes {still[:3]}")
            if self.barrier:
                own = {seg.barrier} | set(seg.clones)
                for node in nodes:
                    if node.name in seg.clones and not any(
                        producer(t) is not None and producer(t).name in own for t in node.inputs
                    ):
                        raise RuntimeError(f"clone {node.name!r} is not behind its barrier")


def _unique(tensors: list[gs.Tensor]) -> list[gs.Tensor]:
    seen: dict[str, gs.Tensor] = {}
    for t in tensors:
        seen.setdefault(t.name, t)
    return list(seen.values())


def _unique_labels(labels: list[str]) -> list[str]:
    count: dict[str, int] = {}
    out = []
    for label in labels:
        k = count.get(label, 0)
        count[label] = k + 1
        out.append(label if k == 0 else f"{label}#{k}")
    return out
