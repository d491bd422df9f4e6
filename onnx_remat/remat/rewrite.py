"""Rewrite pass: clone each segment's forward nodes into the backward pass, behind a barrier.

Input: a :class:`~onnx_remat.analysis.regions.TrainingGraph` and a
:class:`~onnx_remat.remat.plan.RecomputePlan` built on it. Output: a :class:`RewriteResult` with a new
``onnx.ModelProto``. Functional: the pass edits a fresh copy of the graph (on a large graph, the
graph itself in a forked child, whose graph is its own), so neither the input ModelProto nor the
TrainingGraph (nor the plan) changes, and one analysis serves any number of rewrites.

For every segment the pass

1. clones the segment's nodes (a training-mode ``Dropout`` becomes a replay from its stored mask,
   or a Dropout seeded like the forward one, see :mod:`onnx_remat.remat.random_ops`) and points
   every backward reader of a target at its clone, so the original forward tensor is freed as soon
   as the forward pass is done with it;
2. adds one *barrier*, ``com.microsoft::PassThrough``, whose inputs are every tensor the clones
   read from storage plus the *trigger* (the gradient tensors the segment's first backward reader
   consumes) and whose outputs alias its inputs (zero copy). The clones read those outputs. So a
   clone cannot run before the backward pass reaches its segment, and its inputs differ from the
   original node's, which keeps onnxruntime's common-subexpression elimination from merging it
   back (both measured on onnxruntime 1.19.2, ../shared/notes/ort-1.19.md);
3. places barrier and clones in the node list right before the segment's first backward reader:
   onnxruntime's DEFAULT execution order follows the node list closely enough that they then run
   just in time (appended at the end they run ~50 kernels early).

With packed dropout masks (the plan's ``dropout``), each Dropout whose mask a segment releases gets
packing nodes right after it in the forward pass (:mod:`onnx_remat.remat.mask_packing`), and a
``PassThrough`` of its output and the packed bytes that its forward readers read instead of the
output: onnxruntime's DEFAULT order reaches packing nodes only through their readers, and without
a forward reader they would run in the backward pass, keeping the byte mask alive until then.
Segments unpack the mask behind their barrier. With ``seed`` the forward Dropouts get a ``seed``
attribute and their clones are Dropouts with the same one (no mask is stored).

Guarantees, checked after the rewrite (:meth:`RecomputeRewrite.ensures`): the node list is in
topological order; no target is read by a backward node any more; every clone reads at least one
barrier output or another clone of its segment; names of added nodes and tensors are unique.
Clones and barriers are named and tagged as :mod:`onnx_remat.graph.tags` describes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnx_remat import __version__
from onnx_remat.analysis.regions import TrainingGraph, producer, unique_tensors
from onnx_remat.forked import Forked, in_forked_child, worth_sending_back
from onnx_remat.graph import tags
from onnx_remat.graph.bridge import new_node, new_variable
from onnx_remat.graph.conventions import MS_DOMAIN
from onnx_remat.ortsim.kernels import written_inputs
from onnx_remat.remat import mask_packing
from onnx_remat.remat.plan import RecomputePlan, Segment
from onnx_remat.remat.random_ops import (
    dropout_seeds,
    is_replayable,
    is_seedable_gradient,
    replay_inputs,
    seed_of,
)


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
    unpacked: list[str] = field(default_factory=list)  # names of the nodes unpacking dropout masks

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
            unpack_nodes=len(self.unpacked),
        )
        return data


@dataclass
class RewriteResult:
    """The rewritten model and, per segment, what was added."""

    model: onnx.ModelProto
    segments: list[RewrittenSegment]
    fences: list[str] = field(default_factory=list)  # names of the fusion fences added
    # names of the PassThroughs that keep random ops in their draw order: added after the rewrite,
    # where its emulated order needs them (onnx_remat.ortsim.emulation.keep_random_order)
    random_order_pins: list[str] = field(default_factory=list)
    dropout: str = "packed"  # how dropout masks are kept (the plan's)
    packed_masks: list[str] = field(default_factory=list)  # masks stored at one bit per element
    dropout_seeds: dict[str, int] = field(default_factory=dict)  # Dropout node -> seed (dropout="seed")

    @property
    def clone_count(self) -> int:
        return sum(len(s.clones) for s in self.segments)

    def segments_by_index(self, plan: RecomputePlan) -> RewriteResult:
        """This result with each rewritten segment naming its segment of ``plan`` (the plan it was
        made by) by index: what a forked child sends back, since a plan's segments hold the analysed
        graph's objects, which the parent has. :meth:`segments_of` puts them back."""
        index = {id(seg): k for k, seg in enumerate(plan.segments)}
        return self.with_segments(lambda rs: index[id(rs.segment)])

    def segments_of(self, plan: RecomputePlan) -> RewriteResult:
        """A :meth:`segments_by_index` result with the segments of ``plan`` (this process's) again."""
        return self.with_segments(lambda rs: plan.segments[cast(int, rs.segment)])

    def with_segments(self, segment: Callable[[RewrittenSegment], Any]) -> RewriteResult:
        """This result with each rewritten segment's ``segment`` replaced by ``segment(rs)`` (a
        plan's segment, or its index while the result travels: Any)."""
        segments = [dataclasses.replace(rs, segment=segment(rs)) for rs in self.segments]
        return dataclasses.replace(self, segments=segments)


def _working_copy(tg: TrainingGraph, plan: RecomputePlan) -> tuple[TrainingGraph, RecomputePlan]:
    """A copy of the graph with its analysis (:meth:`TrainingGraph.copy`), and ``plan`` in terms of
    its nodes and tensors.

    The rewrite edits graphsurgeon objects in place; it edits these, so the caller's analysis
    stays valid (a pass leaves its input unchanged).
    """
    work, copied = tg.copy()
    tensors = work.tensors

    def node(n: gs.Node) -> gs.Node:
        return copied.node(n)

    def tensor_list(ts: list[gs.Tensor]) -> list[gs.Tensor]:
        return [tensors[t.name] for t in ts]

    segments = [
        dataclasses.replace(
            seg,
            recompute=[node(n) for n in seg.recompute],
            targets=tensor_list(seg.targets),
            boundary=tensor_list(seg.boundary),
            kept=tensor_list(seg.kept),
            masks=tensor_list(seg.masks),
            notes=list(seg.notes),
        )
        for seg in plan.segments
    ]
    return work, dataclasses.replace(plan, segments=segments)


def check_not_rewritten(tg: TrainingGraph) -> None:
    """Raise :class:`RematError` if onnx-remat's rewrite already added nodes to this graph."""
    from onnx_remat.errors import RematError

    already = [n.name for n in tg.order if tags.is_added_name(n.name)]
    if already:
        raise RematError(
            f"this graph was already rewritten by onnx-remat ({len(already)} recompute nodes, e.g. "
            f"{already[0]!r}); apply onnx-remat to the original training graph"
        )


class RewriteUnderway:
    """A rewrite begun by :meth:`RecomputeRewrite.begin`, made in a forked child or made already.

    :meth:`result` is the rewrite as soon as it is made; :meth:`ensured` is the rewrite once its
    postconditions are checked (in the child, after it sent the rewrite). The caller orders and
    emulates the rewrite meanwhile, and takes :meth:`ensured` before it writes anything."""

    def __init__(self, pending: Forked[RewriteResult], plan: RecomputePlan, rewrite: RecomputeRewrite, *, forked: bool):
        self.plan = plan  # the plan being rewritten
        self.rewrite = rewrite  # the pass rewriting it (its options)
        self._pending = pending
        self._forked = forked  # its result names the plan's segments by index (segments_by_index)
        self._result: RewriteResult | None = None

    def result(self) -> RewriteResult:
        """The rewrite (its postconditions perhaps still being checked)."""
        if self._result is None:
            self._result = self._ours(self._pending.result())
        return self._result

    def ensured(self) -> RewriteResult:
        """The rewrite with its postconditions checked: :meth:`result` where the child's check
        passed. Where it failed (or the child died first), the rewrite is made again here, on a
        copy, which raises the violation as the sequential rewrite would; should that one pass, it
        is returned instead (not the same object as :meth:`result`: the caller redoes what it
        made from that)."""
        result = self.result()
        if self._pending.confirmed():
            return result
        return self._ours(self._pending.recompute())

    def _ours(self, result: RewriteResult) -> RewriteResult:
        """``result`` naming the plan's own segments (a forked child's names them by index)."""
        return result.segments_of(self.plan) if self._forked else result

    def cancel(self) -> None:
        """Stop the child, where there is one (its rewrite or its check no longer needed)."""
        self._pending.cancel()


class RecomputeRewrite:
    """The recompute rewrite pass. ``RecomputeRewrite()(tg, plan)`` returns a :class:`RewriteResult`.

    ``barrier=False`` and ``replay_dropout=False`` produce the naive rewrites that the tests use
    to show what the barrier and the dropout replay protect against; don't use them otherwise.
    How dropout masks are kept is the plan's ``dropout``; ``dropout_seed`` shifts the seeds that
    ``dropout="seed"`` gives (:func:`~onnx_remat.remat.random_ops.dropout_seeds`).
    """

    def __init__(
        self,
        *,
        barrier: bool = True,
        replay_dropout: bool = True,
        fence: bool = True,
        dropout_seed: int = 0,
    ):
        self.dropout_seed = dropout_seed
        self.barrier = barrier
        self.replay_dropout = replay_dropout
        self.fence = fence

    def __call__(self, tg: TrainingGraph, plan: RecomputePlan) -> RewriteResult:
        """Rewrite a copy of ``tg``'s graph by ``plan`` (made on ``tg``); ``tg`` stays as it was.

        On a large graph (:func:`~onnx_remat.forked.worth_sending_back`) the rewrite is made in a
        forked child, on the child's own copy of ``tg`` from the fork, edited in place and let go
        with the child: copying the graph and freeing the copy took 2.4 s of a 10^5-node rewrite,
        sending the result back 0.4 s. Where the child fails, it is made here on a copy.
        """
        return self.begin(tg, plan).ensured()

    def begin(self, tg: TrainingGraph, plan: RecomputePlan) -> RewriteUnderway:
        """Start :meth:`__call__`'s rewrite: ``underway = RecomputeRewrite().begin(tg, plan)``, other
        work, then ``underway.result()``, the rewrite as soon as it is made, and
        ``underway.ensured()``, the same once its postconditions (:meth:`ensures`) are checked, which
        is what ``RecomputeRewrite()(tg, plan)`` returns. On a large graph the rewrite is made in its
        forked child meanwhile (the caller can take another child's answer while it waits), which
        sends it back before it checks it: the caller works on the rewrite while the child checks
        it (0.5 s at 10^5 nodes). Else it is made and checked here, now. The precondition is checked
        (and raised) here, now."""
        self.requires(tg, plan)
        if not worth_sending_back(tg.mg.source):
            return RewriteUnderway(Forked.done(self._on_copy(tg, plan)), plan, self, forked=False)
        made: list[RewriteResult] = []  # in the child: its rewrite of its own tg, checked after it is sent

        def in_child() -> RewriteResult:
            if tg.mg.spans_graphs():  # made on a copy, and checked there (_in_place)
                return self._in_place(tg, plan).segments_by_index(plan)
            result = self._in_place(tg, plan, ensure=False)
            made.append(result)
            return result.segments_by_index(plan)

        def ensure_in_child() -> None:
            if made:
                self.ensures(tg, made[0])

        pending = Forked.start(
            lambda: self._on_copy(tg, plan).segments_by_index(plan), child=in_child, then=ensure_in_child
        )
        return RewriteUnderway(pending, plan, self, forked=True)

    def _on_copy(self, tg: TrainingGraph, plan: RecomputePlan) -> RewriteResult:
        """The rewrite on a copy of ``tg`` (:func:`_working_copy`), which is then let go."""
        work, work_plan = _working_copy(tg, plan)
        result = self.call(work, work_plan)
        self.ensures(work, result)
        # The result names its segments by the caller's plan (the same segments, on ``tg``), not by
        # the working copy's: nothing then holds the copy, the whole edited graphsurgeon graph
        # (hundreds of MiB at 10^5 nodes), once the model is written.
        caller = {id(w): s for w, s in zip(work_plan.segments, plan.segments)}
        result.segments = [dataclasses.replace(r, segment=caller[id(r.segment)]) for r in result.segments]
        # What this pass kept of the copy goes too, and the copy's cycles are broken so that it is
        # freed now rather than scanned by the cyclic collector.
        for kept in (self._constants, self._anchored, self._anchors, self._packs_nodes, self._packs, self._copied):
            kept.clear()
        work.mg.release()
        return result

    def _in_place(self, tg: TrainingGraph, plan: RecomputePlan, *, ensure: bool = True) -> RewriteResult:
        """The rewrite on ``tg`` itself: only in a forked child, whose ``tg`` is its own (one whose graph
        has subgraphs or local functions: on a copy, as a fresh import of it, and checked there).
        ``ensure=False``: not checked (:meth:`ensures`); the caller checks it after sending it."""
        if not in_forked_child():
            raise RuntimeError("RecomputeRewrite._in_place edits the caller's graph: only a forked child may")
        if tg.mg.spans_graphs():  # copied by importing it again: written as that import writes it
            return self._on_copy(tg, plan)
        tg.mg.unread_constants()  # written as on a copy (ModelGraph.copy)
        result = self.call(tg, plan)
        if ensure:
            self.ensures(tg, result)
        return result

    # -- preconditions -------------------------------------------------------------------------

    def requires(self, tg: TrainingGraph, plan: RecomputePlan) -> None:
        """The graph has not been rewritten by onnx-remat before, and the plan has segments."""
        from onnx_remat.errors import RematError

        check_not_rewritten(tg)
        if not plan.segments:
            raise RematError(
                "nothing to recompute: " + "; ".join(s.reason for s in plan.skipped)
                if plan.skipped
                else "nothing to recompute"
            )

    # -- the work ------------------------------------------------------------------------------

    def call(self, tg: TrainingGraph, plan: RecomputePlan) -> RewriteResult:
        graph = tg.graph
        labels = _unique_labels([s.label for s in plan.segments])
        # Triggers and readers are read off the original graph before any edge changes.
        staged = [(seg, label, self._schedule(tg, seg)) for seg, label in zip(plan.segments, labels)]

        producers = {id(producer(t)): producer(t) for seg in plan.segments for t in seg.targets}
        edges_before = {pid: _output_edges(p) for pid, p in producers.items()}
        for seg in plan.segments:
            for node in seg.recompute:
                if id(node) not in edges_before:
                    edges_before[id(node)] = _output_edges(node)
        self._copied: list[tuple[gs.Node, gs.Node]] = []  # (original, clone) for clones of the same op

        self._constants: dict[str, gs.Constant] = {}
        self._mask_shapes = plan.mask_shapes
        after: dict[int, list[gs.Node]] = {}
        self._anchored: dict[str, gs.Tensor] = {}  # PassThrough output -> the Dropout output it passes
        self._anchors: dict[str, list[gs.Tensor]] = {}  # the reverse
        self._packs_nodes: dict[int, gs.Node] = {}
        self._seeded: set[int] = set()
        self._packs = self._pack_masks(tg, plan, after) if plan.dropout == "packed" else {}
        self._seeds = self._seed_dropouts(tg, plan) if plan.dropout == "seed" else {}

        before: dict[int, list[gs.Node]] = {}
        moved: set[int] = set()
        done: list[RewrittenSegment] = []
        copies: dict[int, int] = {}  # id(node) -> clones made so far (stages may clone a node again)
        shared: dict[str, gs.Tensor] = {}  # target name -> its clone, for later segments' from_clones
        all_added: list[gs.Node] = []
        for seg, label, sched in staged:
            missing = [name for name in seg.from_clones if name not in shared]
            if missing:
                raise RuntimeError(f"segment {label} reads clones no earlier segment makes: {missing[:3]}")
            added, rewritten = self._rewrite_segment(
                tg, seg, label, sched.readers, sched.triggers, sched.insert_at, copies, shared
            )
            rewritten.notes.extend(sched.notes)
            late = [n for n in sched.moved if id(n) not in moved]
            moved.update(id(n) for n in late)
            before.setdefault(id(sched.insert_at), []).extend(added + late)
            all_added.extend(added)
            done.append(rewritten)
        if plan.dropout == "seed":
            forward = [n for n in tg.order if id(n) in self._seeded]
            _drop_unread_masks(forward + [n for n in all_added if n.op == "Dropout"], tg.graph)
        fences = self._fence(tg, producers, edges_before, before)
        fences += self._fence_clones(tg, edges_before, after)
        graph.nodes = _emit(tg.order, before, moved, after)

        plan_json = json.dumps([s.summary() for s in done], sort_keys=True)
        packed = [n.outputs[1].name for n in self._packs_nodes.values()]
        dropout_json = json.dumps({"mode": plan.dropout, "seeds": self._seeds, "packed": packed}, sort_keys=True)
        model = tg.mg.to_model(
            extra_opsets={MS_DOMAIN: 1},
            metadata={tags.PLAN_KEY: plan_json, tags.DROPOUT_KEY: dropout_json, tags.VERSION_KEY: __version__},
        )
        return RewriteResult(
            model=model,
            segments=done,
            fences=fences,
            dropout=plan.dropout,
            packed_masks=packed,
            dropout_seeds=dict(self._seeds),
        )

    def _pack_masks(
        self, tg: TrainingGraph, plan: RecomputePlan, after: dict[int, list[gs.Node]]
    ) -> dict[int, mask_packing.Packed]:
        """Pack the mask of every Dropout whose mask a segment releases, right after the Dropout.

        The Dropout's forward readers then read its output through a ``PassThrough`` that also
        takes the packed bytes: onnxruntime's DEFAULT order reaches the packing nodes only through
        a reader, and the barriers reading them run in the backward pass.
        """
        dropouts: dict[int, gs.Node] = {}
        for seg in plan.segments:
            for t in seg.targets:
                p = producer(t)
                if p is not None and is_replayable(p) and t is p.outputs[1]:
                    dropouts[id(p)] = p
        self._packs_nodes = dropouts
        packs: dict[int, mask_packing.Packed] = {}
        for node in sorted(dropouts.values(), key=lambda n: tg.position[id(n)]):
            mask, out = node.outputs[1], node.outputs[0]
            name = node.name or f"{node.op}_{tg.position[id(node)]}"
            packed = mask_packing.pack(mask, self._mask_shapes.get(mask.name), tags.pack_name(name), self._constants)
            for n in packed.nodes:
                tg.mg.set_extras(
                    n,
                    f"onnx-remat: packs the mask of {name} to one bit per element for the backward pass",
                    {tags.ROLE_KEY: tags.ROLE_PACK, tags.SOURCE_KEY: name},
                )
            readers = [c for c in out.outputs if id(c) in tg.position and tg.is_forward(c)]
            passed = new_variable(f"{out.name}/remat_pack", dtype=out.dtype, shape=out.shape)
            waited = new_variable(f"{packed.packed.name}/remat_pack", dtype=packed.packed.dtype)
            anchor = new_node(
                op="PassThrough",
                name=f"{tags.pack_name(name)}/wait",
                domain=MS_DOMAIN,
                inputs=[out, packed.packed],
                outputs=[passed, waited],
            )
            tg.mg.set_extras(
                anchor,
                f"onnx-remat: the forward readers of {out.name} wait (zero copy) until its mask is packed, so the "
                "packing runs right after the Dropout and the byte mask is freed there",
                {tags.ROLE_KEY: tags.ROLE_PACK, tags.SOURCE_KEY: name},
            )
            for reader in readers:
                for i, t in enumerate(reader.inputs):
                    if t is out:
                        reader.inputs[i] = passed
            self._anchored[passed.name] = out
            self._anchors[out.name] = [passed]
            after[id(node)] = [*packed.nodes, anchor]
            # Later readers take the bytes from the PassThrough: an output nobody reads would keep
            # its buffer (here: the packed bytes) allocated to the end of the step.
            packed.packed = waited
            packs[id(node)] = packed
        return packs

    def _unpack(
        self, tg: TrainingGraph, node: gs.Node, label: str, copy: int, gate
    ) -> tuple[gs.Variable, list[gs.Node]]:
        """The copy of ``node``'s mask that segment ``label`` unpacks from the packed bytes (passed
        through its barrier by ``gate``), and the nodes that unpack it."""
        mask = node.outputs[1]
        packed = self._packs[id(node)]
        name = node.name or f"{node.op}_{tg.position[id(node)]}"
        mask_copy = new_variable(tags.clone_tensor_name(mask.name, copy), dtype=mask.dtype, shape=mask.shape)
        steps = mask_packing.unpack(
            gate(packed.packed),
            [gate(t) for t in packed.extra],
            mask_packing.static_shape(self._mask_shapes.get(mask.name)),
            mask_copy,
            tags.unpack_name(label, name),
            self._constants,
        )
        for n in steps:
            tg.mg.set_extras(
                n,
                f"onnx-remat: unpacks the mask of {name} for segment {label}",
                {tags.ROLE_KEY: tags.ROLE_UNPACK, tags.SEGMENT_KEY: label, tags.SOURCE_KEY: name},
            )
        return mask_copy, steps

    def _output_needed(self, node: gs.Node, inside: set[int], target_names: set[str]) -> bool:
        """Whether a segment recomputing Dropout ``node`` needs its output (a target, or read by
        another of the nodes it recomputes) and not only its mask."""
        out = node.outputs[0]
        readers = list(out.outputs) + [c for t in self._anchors.get(out.name, ()) for c in t.outputs]
        return out.name in target_names or any(id(c) in inside for c in readers)

    def _redraws(self, reader: gs.Node, target_names: set[str]) -> gs.Node | None:
        """The seeded forward Dropout whose released mask ``reader`` (a ``DropoutGrad``) reads, if any."""
        for t in reader.inputs:
            if t.name in target_names:
                dropout = producer(t)
                if (
                    dropout is not None
                    and id(dropout) in self._seeded
                    and t is dropout.outputs[1]
                    and is_seedable_gradient(reader, t)
                ):
                    return dropout
        return None

    def _redraw(self, tg: TrainingGraph, reader: gs.Node, dropout: gs.Node) -> None:
        """Turn ``DropoutGrad(dy, mask, ...)`` into ``Dropout(dy, ratio, training_mode)`` seeded like
        ``dropout``: the same expression on the same mask, drawn again instead of kept."""
        dy = reader.inputs[0]
        reader.inputs.clear()
        reader.inputs.extend([dy, *dropout.inputs[1:3]])
        reader.op = "Dropout"
        reader.domain = ""
        reader.attrs = {"seed": int(dropout.attrs["seed"])}
        extras = tg.mg.extras(reader)
        metadata = dict(extras.metadata)
        metadata.update({tags.ROLE_KEY: tags.ROLE_REDRAW, tags.SOURCE_KEY: dropout.name})
        doc = (extras.doc_string + "\n" if extras.doc_string else "") + (
            f"onnx-remat: was DropoutGrad; draws the mask of {dropout.name} again with its seed "
            f"{reader.attrs['seed']} instead of reading it from storage"
        )
        tg.mg.set_extras(reader, doc, metadata)

    def _seed_dropouts(self, tg: TrainingGraph, plan: RecomputePlan) -> dict[str, int]:
        """Give every Dropout a segment recomputes a ``seed`` (kept if it has one); name -> seed."""
        nodes: dict[int, gs.Node] = {}
        for seg in plan.segments:
            for n in seg.recompute:
                if is_replayable(n):
                    nodes[id(n)] = n
        ordered = sorted(nodes.values(), key=lambda n: tg.position[id(n)])
        self._seeded = set(nodes)
        for n in ordered:
            if not n.name:
                n.name = f"{n.op}_{tg.position[id(n)]}"  # the seed is recorded by node name
        fresh = dropout_seeds([n.name for n in ordered if seed_of(n) is None], self.dropout_seed)
        seeds: dict[str, int] = {}
        for n in ordered:
            if seed_of(n) is None:
                n.attrs["seed"] = fresh[n.name]
            seeds[n.name] = int(n.attrs["seed"])
        return seeds

    def _fence(
        self,
        tg: TrainingGraph,
        producers: dict[int, gs.Node],
        edges_before: dict[int, int],
        before: dict[int, list[gs.Node]],
    ) -> list[str]:
        """Keep onnxruntime from fusing forward nodes that the rewrite left with one reader.

        onnxruntime's session optimizer fuses a node into its reader only when the node has a
        single output edge (e.g. ``Add`` + ``LayerNormalization`` into ``SkipLayerNormalization``,
        whose CPU kernel does not produce the mean and inverse std-dev that
        ``LayerNormalizationGrad`` reads: the step then fails). A forward node whose backward
        readers moved to clones can drop to one edge and become fusable although it was not in
        the original graph. Its last edge then goes through a ``PassThrough`` (zero copy), which
        no fusion pattern looks through, so the original's fusions stay as they were. Pairs whose
        fusion onnxruntime makes whatever the edge count (a transpose or a scalar scale folded into
        a matrix product), and so made in the original graph too, are left alone: fencing them
        would keep the transpose's output in memory.
        """
        fences: list[str] = []
        if not self.fence:
            return fences
        graph_outputs = {o.name for o in tg.graph.outputs}
        for pid, node in producers.items():
            if edges_before[pid] < 2 or _output_edges(node) != 1:
                continue
            tensor = next(t for t in node.outputs if t.outputs)
            reader = tensor.outputs[0]
            if tensor.name in graph_outputs or _harmless_fusion(node, reader):
                continue
            fence = self._fence_edge(tg, node, tensor, reader, "now that the backward pass reads a recomputed copy")
            before.setdefault(id(reader), []).append(fence)
            fences.append(fence.name)
        return fences

    def _fence_clones(
        self, tg: TrainingGraph, edges_before: dict[int, int], after: dict[int, list[gs.Node]]
    ) -> list[str]:
        """Keep onnxruntime from fusing a clone that its original could not be fused as.

        A clone has the readers its original had among the clones and the backward readers moved
        to it, not the original's other forward readers: a node with two readers in the original
        (a biased ``Conv`` read by a ``Dropout`` and an ``Add``) can have one as a clone, and
        onnxruntime then fuses it into that reader (``FusedConv`` adding the ``Add``'s other input
        into the convolution's sum). The fused kernel rounds differently, so the recomputed tensor,
        and the gradients read from it, would differ from the original's in the last bit (measured:
        a 3x3 convolution's weight gradient off by 3.7e-9). Such a clone's one edge, when it leads
        to another clone and the clone is of an op a fusion absorbs (:data:`_FUSION_HEADS`), goes
        through a ``PassThrough`` (zero copy) placed right after it, as :meth:`_fence` does for
        originals.
        """
        fences: list[str] = []
        if not self.fence:
            return fences
        clones = {id(clone) for _, clone in self._copied}
        for node, clone in self._copied:
            if edges_before.get(id(node), 0) < 2 or _output_edges(clone) != 1:
                continue
            tensor = next(t for t in clone.outputs if t.outputs)
            reader = tensor.outputs[0]
            if id(reader) not in clones or clone.op not in _FUSION_HEADS or _harmless_fusion(clone, reader):
                continue  # (onnxruntime fuses no forward op into a gradient op)
            fence = self._fence_edge(tg, clone, tensor, reader, f"as {node.name or node.op} was not in the original")
            after.setdefault(id(clone), []).append(fence)
            fences.append(fence.name)
        return fences

    def _fence_edge(self, tg: TrainingGraph, node: gs.Node, tensor: gs.Variable, reader: gs.Node, why: str) -> gs.Node:
        """A fence node that passes ``tensor``, ``node``'s output, to ``reader`` (rewired to read
        it); placed by the caller."""
        fenced = new_variable(tags.fence_tensor_name(tensor.name), dtype=tensor.dtype, shape=tensor.shape)
        fence = new_node(
            op="PassThrough", name=tags.fence_name(tensor.name), domain=MS_DOMAIN, inputs=[tensor], outputs=[fenced]
        )
        tg.mg.set_extras(
            fence,
            f"onnx-remat fence: passes {tensor.name} through (zero copy) so that onnxruntime does not fuse "
            f"{node.name or node.op} into {reader.name or reader.op} {why}",
            {tags.ROLE_KEY: tags.ROLE_FENCE},
        )
        for i, t in enumerate(reader.inputs):
            if t is tensor:
                reader.inputs[i] = fenced
        return fence

    def _schedule(self, tg: TrainingGraph, seg: Segment) -> _Schedule:
        """Where a segment's clones go and what they wait for.

        The trigger is the gradient input of the segment's first backward reader. A reader that
        has no gradient input (e.g. a Reshape feeding a weight-gradient MatMul) cannot provide
        one; then the trigger comes from the next reader that has, excluding gradients computed
        from the earlier readers (that would be a cycle), and the earlier readers (with what
        depends on them up to there) move to just after the clones.
        """
        by_id: dict[int, gs.Node] = {}
        for t in seg.targets:
            for n in tg.backward_consumers(t):
                by_id[id(n)] = n
        readers = sorted(by_id.values(), key=lambda n: tg.position[id(n)])
        for k, reader in enumerate(readers):
            triggers = unique_tensors([t for t in reader.inputs if _is_gradient(tg, t)])
            if not triggers:
                continue
            moved: list[gs.Node] = []
            if k:
                moved = _downstream_before(tg, readers[:k], tg.position[id(reader)])
                blocked = {id(n) for n in moved}
                triggers = [t for t in triggers if id(producer(t)) not in blocked]
                if not triggers:
                    continue
            return _Schedule(readers, triggers, reader, moved, [])
        if tg.seed is not None:
            note = "no gradient input reaches this segment's readers: the loss gradient seed is the trigger"
            return _Schedule(readers, [tg.seed], readers[0], [], [note])
        return _Schedule(readers, [], readers[0], [], ["no trigger found: clones may run early"])

    def _rewrite_segment(
        self, tg, seg: Segment, label: str, readers, triggers, insert_at, copies: dict[int, int], shared=None
    ):
        """Clone ``seg``'s nodes, point its backward ``readers`` at the clones and put the clones
        behind the segment's barrier. Returns the nodes that go right before ``insert_at`` (the
        barrier first) and the :class:`RewrittenSegment`. ``copies`` counts the clones made of each
        node so far; ``shared`` maps the targets of earlier segments to their clones (this
        segment's are added)."""
        shared = {} if shared is None else shared
        work = _SegmentClones(seg, label, self.barrier, self._anchored, shared)
        self._clone_nodes(tg, seg, work, copies)
        rewired = self._rewire_readers(tg, readers, work)
        for t in seg.targets:
            if t.name in work.clone_of:  # a Dropout mask replayed from storage or drawn again has no clone
                shared[t.name] = work.clone_of[t.name]

        added: list[gs.Node] = []
        barrier_name = None
        if self.barrier:
            barrier = self._barrier(tg, work, triggers)
            barrier_name = barrier.name
            added.append(barrier)
        added.extend(work.placed)
        rewritten = RewrittenSegment(
            segment=seg,
            label=label,
            barrier=barrier_name,
            triggers=[t.name for t in triggers] if self.barrier else [],
            clones=[c.name for c in work.clones],
            first_consumer=insert_at.name,
            rewired_inputs=rewired,
            unpacked=[n.name for n in work.unpacked],
        )
        return added, rewritten

    def _clone_nodes(self, tg: TrainingGraph, seg: Segment, work: _SegmentClones, copies: dict[int, int]) -> None:
        """Clone the nodes ``seg`` recomputes, in order, into ``work`` (tagged with what each does)."""
        label = work.label
        for index, node in enumerate(seg.recompute):
            copy = copies[id(node)] = copies.get(id(node), 0) + 1
            name = tags.clone_name(node.name, node.op, index, copy)
            made = self._clone_node(tg, node, name, copy, work)
            if made is None:
                continue
            clone, outputs, what = made
            if clone.op == node.op and clone.domain == node.domain:
                self._copied.append((node, clone))
            for orig, new in zip(node.outputs, outputs):
                if orig.name and new.name:
                    work.clone_of[orig.name] = new
            metadata = dict(tg.mg.extras(node).metadata)
            metadata.update({tags.ROLE_KEY: tags.ROLE_CLONE, tags.SEGMENT_KEY: label, tags.SOURCE_KEY: node.name})
            tg.mg.set_extras(clone, f"onnx-remat clone: {what} for the backward pass (segment {label})", metadata)
            work.placed.append(clone)
            work.clones.append(clone)

    def _clone_node(
        self, tg: TrainingGraph, node: gs.Node, name: str, copy: int, work: _SegmentClones
    ) -> tuple[gs.Node, list[gs.Variable], str] | None:
        """The clone of ``node`` named ``name``, its outputs and what it does (for its doc string),
        or None where the segment needs no clone of it (only a Dropout's mask, unpacked or drawn
        again by its gradient nodes). A Dropout is replayed from its mask (unpacked first, into
        ``work``, when packed); any other node is copied, with scratch buffers (into ``work``) for
        the inputs its kernel overwrites."""
        replay = self.replay_dropout and is_replayable(node) and id(node) not in self._seeded
        if replay and id(node) in self._packs:
            # One unpacked copy serves the mask's backward readers and the replay; with
            # onnxruntime's planner a second copy for the replay saved nothing (measured).
            mask, out = node.outputs[1], node.outputs[0]
            mask_copy, steps = self._unpack(tg, node, work.label, copy, work.gate)
            work.placed.extend(steps)
            work.unpacked.extend(steps)
            work.clone_of[mask.name] = mask_copy
            if not self._output_needed(node, work.inside, work.target_names):
                return None  # only the mask is needed: no replay of the output
            inputs = [work.source(t) for t in replay_inputs(node, node.inputs[0])]
            inputs[1] = mask_copy
            outputs = [new_variable(tags.clone_tensor_name(out.name, copy), dtype=out.dtype, shape=out.shape)]
            clone = new_node(op="DropoutGrad", name=name, domain=MS_DOMAIN, inputs=inputs, outputs=outputs)
            return clone, outputs, f"replays Dropout {node.name} from its packed mask"
        if (
            id(node) in self._seeded
            and not self._output_needed(node, work.inside, work.target_names)
            and all(is_seedable_gradient(c, node.outputs[1]) for c in node.outputs[1].outputs if tg.is_backward(c))
        ):
            return None  # only the mask is needed, and its gradient nodes draw it themselves
        if replay:
            inputs = [work.source(t) for t in replay_inputs(node, node.inputs[0])]
            out = node.outputs[0]
            outputs = [new_variable(tags.clone_tensor_name(out.name, copy), dtype=out.dtype, shape=out.shape)]
            clone = new_node(op="DropoutGrad", name=name, domain=MS_DOMAIN, inputs=inputs, outputs=outputs)
            return clone, outputs, f"replays Dropout {node.name} from its stored mask"
        outputs = [
            new_variable(tags.clone_tensor_name(o.name, copy), dtype=o.dtype, shape=o.shape)
            if o.name
            else new_variable("")
            for o in node.outputs
        ]
        inputs = [work.source(t) for t in node.inputs]
        for i in written_inputs(node.domain, node.op):
            if i < len(inputs) and inputs[i].name:
                # gated even when an initializer, so the scratch waits for the barrier too
                inputs[i] = self._scratch(tg, work.gate(node.inputs[i]), name, i, work.placed)
        clone = new_node(
            op=node.op,
            name=name,
            domain=node.domain,
            attrs=dict(node.attrs),
            inputs=inputs,
            outputs=outputs,
        )
        what = f"recomputes {node.name or node.op}"
        if node.name in self._seeds and is_replayable(node):
            what = f"draws Dropout {node.name} again with its seed {self._seeds[node.name]}"
        return clone, outputs, what

    def _rewire_readers(self, tg: TrainingGraph, readers: list[gs.Node], work: _SegmentClones) -> int:
        """Point the segment's backward ``readers`` at the clones of its targets (the gradient of a
        seeded Dropout draws the mask again instead of reading it); returns how many inputs changed."""
        rewired = 0
        for reader in readers:
            if self._seeds:
                dropout = self._redraws(reader, work.target_names)
                if dropout is not None:
                    self._redraw(tg, reader, dropout)
                    rewired += 1
                    continue
            for i, t in enumerate(reader.inputs):
                if t.name in work.target_names:
                    reader.inputs[i] = work.clone_of[t.name]
                    rewired += 1
        return rewired

    def _barrier(self, tg: TrainingGraph, work: _SegmentClones, triggers: list[gs.Tensor]) -> gs.Node:
        """The segment's barrier: a ``PassThrough`` of every stored tensor its clones read (in the
        order they were gated) and of the ``triggers``, whose outputs the clones read."""
        label = work.label
        pass_inputs = work.gate_order + triggers
        pass_outputs = [work.gated[t.name] for t in work.gate_order] + [
            new_variable(tags.gate_tensor_name(t.name, label), dtype=t.dtype, shape=t.shape) for t in triggers
        ]
        barrier = new_node(
            op="PassThrough", name=tags.barrier_name(label), domain=MS_DOMAIN, inputs=pass_inputs, outputs=pass_outputs
        )
        trigger_names = ", ".join(t.name for t in triggers) or "nothing"
        tg.mg.set_extras(
            barrier,
            f"onnx-remat barrier of segment {label}: passes the clones' stored inputs through (zero copy) once "
            f"{trigger_names} exists, so the clones run when the backward pass reaches the segment and are "
            "not merged back into the forward nodes",
            {tags.ROLE_KEY: tags.ROLE_BARRIER, tags.SEGMENT_KEY: label},
        )
        return barrier

    @staticmethod
    def _scratch(tg: TrainingGraph, tensor: gs.Tensor, clone: str, index: int, out: list[gs.Node]) -> gs.Tensor:
        """A fresh buffer shaped like ``tensor`` for an input the cloned kernel overwrites in place
        (``BatchNormInternal``'s running statistics): the clone must not update the model's
        statistics a second time. ``Mul(tensor, 0)``: the values are never read (training mode
        normalizes with batch statistics)."""
        zero = gs.Constant(f"{clone}/scratch_zero_{index}", np.zeros((), dtype=tensor.dtype or np.float32))
        buf = new_variable(f"{clone}/scratch_{index}", dtype=tensor.dtype, shape=tensor.shape)
        node = new_node(op="Mul", name=f"{clone}/scratch_{index}", inputs=[tensor, zero], outputs=[buf])
        tg.mg.set_extras(
            node,
            f"onnx-remat: scratch buffer for input {index} of {clone}, which its kernel overwrites in place",
            {tags.ROLE_KEY: tags.ROLE_CLONE},
        )
        out.append(node)
        return buf

    # -- postconditions ------------------------------------------------------------------------

    def ensures(self, tg: TrainingGraph, result: RewriteResult) -> None:
        """Check the guarantees in the module docstring on the rewritten graph; raise on violation."""
        nodes = tg.graph.nodes
        produced: set[str] = set()
        names: set[str] = set()
        # One walk: an input not produced before its reader (a graph input, or one produced later:
        # the order is broken) is looked up once the walk has seen every output.
        unproduced: list[tuple[str, str]] = []
        for node in nodes:
            for t in node.inputs:
                if t.name and t.name not in produced:
                    unproduced.append((t.name, node.name))
            for out in node.outputs:
                if out.name:
                    if out.name in produced:
                        raise RuntimeError(f"rewrite produced tensor {out.name!r} twice")
                    produced.add(out.name)
            if tags.is_clone_name(node.name) or tags.is_barrier_name(node.name):
                if node.name in names:
                    raise RuntimeError(f"rewrite produced node name {node.name!r} twice")
                names.add(node.name)
        for name, reader in unproduced:
            if name in produced:
                raise RuntimeError(f"rewrite broke the topological order at node {reader!r}")
        by_name = {n.name: n for n in nodes if n.name}
        for seg in result.segments:
            for t in seg.segment.targets:
                still = [n.name for n in t.outputs if tg.is_backward(n)]
                if still:
                    raise RuntimeError(f"{t.name} is still read by backward nodes {still[:3]}")
            if self.barrier:
                own = {seg.barrier} | set(seg.clones) | set(seg.unpacked)
                for name in seg.clones:
                    clone = by_name[name]
                    feeders = [_through_fence(producer(t)) for t in clone.inputs]
                    if not any(p is not None and p.name in own for p in feeders):
                        raise RuntimeError(f"clone {name!r} is not behind its barrier")


class _SegmentClones:
    """One segment's clones while the rewrite makes them, and what they read: each stored tensor
    once through the segment's barrier (:meth:`gate`), a tensor the segment recomputes from its
    clone, a boundary an earlier segment recomputed from that clone (:meth:`source`)."""

    def __init__(
        self,
        seg: Segment,
        label: str,
        barrier: bool,
        anchored: dict[str, gs.Tensor],
        shared: dict[str, gs.Tensor],
    ):
        self.label = label
        self.barrier = barrier
        self.anchored = anchored  # PassThrough output -> the Dropout output it passes
        self.shared = shared  # target name -> its clone, made by an earlier segment
        self.from_clones = set(seg.from_clones)
        self.inside = {id(n) for n in seg.recompute}
        self.target_names = {t.name for t in seg.targets}
        self.gated: dict[str, gs.Tensor] = {}  # stored tensor name -> the barrier output the clones read
        self.gate_order: list[gs.Tensor] = []  # the stored tensors, in the order they were gated
        self.clone_of: dict[str, gs.Tensor] = {}  # forward tensor name -> its clone in this segment
        self.clones: list[gs.Node] = []
        self.placed: list[gs.Node] = []  # clones, their scratch buffers and unpacking nodes, in order
        self.unpacked: list[gs.Node] = []

    def gate(self, t: gs.Tensor) -> gs.Tensor:
        """The barrier output that passes stored tensor ``t`` (``t`` itself without a barrier)."""
        if not self.barrier:
            return t
        out = self.gated.get(t.name)
        if out is None:
            out = new_variable(tags.gate_tensor_name(t.name, self.label), dtype=t.dtype, shape=t.shape)
            self.gated[t.name] = out
            self.gate_order.append(t)
        return out

    def source(self, t: gs.Tensor) -> gs.Tensor:
        """What a clone reads for its original's input ``t``."""
        if not t.name or isinstance(t, gs.Constant):
            return t  # omitted optional input or initializer: read directly
        t = self.anchored.get(t.name, t)  # a Dropout output its forward readers now read packed
        if t.name in self.clone_of:
            return self.clone_of[t.name]
        # A boundary an earlier segment recomputed: its clone, through this segment's barrier.
        return self.gate(self.shared[t.name] if t.name in self.from_clones else t)


@dataclass
class _Schedule:
    readers: list[gs.Node]  # backward nodes reading the segment's targets, topological order
    triggers: list[gs.Tensor]
    insert_at: gs.Node  # barrier and clones go right before this node
    moved: list[gs.Node]  # earlier readers (and dependents) that move after the clones
    notes: list[str]


_MATMULS = frozenset({"MatMul", "FusedMatMul", "Gemm", "TransposeMatMul"})

# The ops onnxruntime 1.19's CPU fusions absorb into a single reader (the first node of a fused
# pattern, or one inside it): Conv (ConvAddActivation, ConvActivation), MatMul and Gemm (MatMulAdd,
# GemmActivation), Add (SkipLayerNorm, BiasGelu, BiasSoftmax), the element-wise ops of the GELU and
# LayerNorm patterns, Cast, Gather (EmbedLayerNorm), Shape (ReshapeFusion) and Q/DQ. A clone of
# another op (Reshape, LayerNormalization, Softmax, ...) that drops to one reader is not fenced:
# no fusion would take it, and a fence is a node more per step (GPT-2 small's --budget min: 462).
_FUSION_HEADS = frozenset(
    {
        "Conv",
        "MatMul",
        "Gemm",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "Sqrt",
        "Erf",
        "Tanh",
        "Sigmoid",
        "ReduceMean",
        "Cast",
        "Gather",
        "Shape",
        "QuantizeLinear",
        "DequantizeLinear",
    }
)


def _harmless_fusion(node: gs.Node, reader: gs.Node) -> bool:
    """Fusions of ``node`` into ``reader`` that onnxruntime also makes when ``node`` has other readers.

    ``MatmulTransposeFusion`` / ``GemmTransposeFusion`` (a Transpose into a matrix product) and
    ``MatMulScaleFusion`` of a Mul/Div by a scalar *feeding* one: they keep the node for its other
    readers, so the original graph was fused the same way. (A scale *after* a matrix product is
    fused only when it is the product's single reader: that one is fenced.)
    """
    if reader.op == "PassThrough" and reader.domain == MS_DOMAIN:
        return True  # no pattern fuses into a PassThrough (the pins of random ops are ones)
    if "Transpose" in (node.op, reader.op):
        return True  # layout: the TransposeOptimizer's business, and a fence would stop its cancelling
    return reader.op in _MATMULS and node.op in ("Transpose", "Mul", "Div")


def _through_fence(node: gs.Node | None) -> gs.Node | None:
    """``node``, or the node a fence passes on when ``node`` is one."""
    if node is not None and tags.is_fence_name(node.name):
        return producer(node.inputs[0])
    return node


def _output_edges(node: gs.Node) -> int:
    """Input slots that read any output of ``node`` (onnxruntime's ``Node::GetOutputEdgesCount``)."""
    return sum(1 for out in node.outputs for c in out.outputs for t in c.inputs if t is out)


def _is_gradient(tg: TrainingGraph, t: gs.Tensor) -> bool:
    p = producer(t) if t.name else None
    return p is not None and tg.is_backward(p)


def _downstream_before(tg: TrainingGraph, starts: list[gs.Node], limit: int) -> list[gs.Node]:
    """``starts`` and every node depending on them positioned before ``limit``, in order."""
    seen = {id(n): n for n in starts}
    stack = list(starts)
    while stack:
        node = stack.pop()
        for out in node.outputs:
            for c in out.outputs:
                if id(c) not in seen and tg.position[id(c)] < limit:
                    seen[id(c)] = c
                    stack.append(c)
    return sorted(seen.values(), key=lambda n: tg.position[id(n)])


def _drop_unread_masks(nodes: list[gs.Node], graph: gs.Graph) -> None:
    """Drop the mask output of Dropouts whose mask nobody reads any more (seeded forward Dropouts,
    clones that recompute only the output): onnxruntime keeps the buffer of an output that no node
    reads allocated to the end of the step (measured: 18 MiB more on blocks10); without the output
    the kernel uses a scratch buffer of its own."""
    outputs = {t.name for t in graph.outputs}
    for node in nodes:
        if len(node.outputs) == 2 and not node.outputs[1].outputs and node.outputs[1].name not in outputs:
            node.outputs.pop()


def _emit(
    order: list[gs.Node],
    before: dict[int, list[gs.Node]],
    moved: set[int],
    after: dict[int, list[gs.Node]] | None = None,
) -> list[gs.Node]:
    """The new node list: ``before[id(n)]`` goes right before ``n`` and ``after[id(n)]`` right
    after it; moved nodes only go where a ``before`` list puts them."""
    after = after or {}
    out: list[gs.Node] = []
    for node in order:
        if id(node) in moved:
            continue
        stack: list[tuple[bool, gs.Node]] = [(False, node)]
        while stack:
            expanded, n = stack.pop()
            if expanded or id(n) not in before:
                out.append(n)
                out.extend(after.get(id(n), ()))
                continue
            stack.append((True, n))
            stack.extend((False, m) for m in reversed(before[id(n)]))
    return out


def _unique_labels(labels: list[str]) -> list[str]:
    count: dict[str, int] = {}
    out = []
    for label in labels:
        k = count.get(label, 0)
        count[label] = k + 1
        out.append(label if k == 0 else f"{label}#{k}")
    return out
