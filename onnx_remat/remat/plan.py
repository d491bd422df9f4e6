"""Analysis pass: turn a user's selection into a recompute plan of segments.

Input: a :class:`~onnx_remat.analysis.regions.TrainingGraph`, its :class:`~onnx_remat.analysis.scopes.ScopeTree`,
tensor sizes and a :class:`Selection`. Output: a :class:`RecomputePlan` whose segments say which
forward nodes to clone, which stashed tensors the backward pass will read from the clones
(*targets*), and which tensors the clones read from storage (*boundary*).

Semantics (following MindSpore and Paddle, see ../shared/seeds):

* ``scopes`` (``Cell.recompute()``): each matched scope instance is a segment. Every forward node
  inside it is recomputed except its *output nodes* (those with an output used outside the scope),
  which stay stored. Clones read the scope's inputs from storage.
* ``op_types`` / ``nodes`` (``Primitive.recompute()``): the selected nodes' stashed outputs are
  recomputed; the clones pull in the producers of any input that is not stored anyway (stored:
  stashed for the backward pass, a graph input or an initializer). Selections whose clones
  overlap form one segment.
* ``recompute_outputs`` (``mindspore.recompute(..., output_recompute=True)``): when a matched scope
  feeds another matched scope, its output is not stored either and the two are merged. The merged
  group is recomputed in stages, one per scope, each from the group's stored inputs when the
  backward pass reaches that scope (:meth:`Planner._staged_group`).

Never recomputed: nodes reading a tensor another node overwrites in place (a gradient buffer, a
running statistic), stored tensors next to a Transpose that onnxruntime may move (see
:meth:`Planner._layout_free`), random ops (their outputs stay stored; a ``Dropout`` *is* recomputed by
re-applying its stored mask, which reproduces its output exactly, as Paddle's
``preserve_rng_state`` does), nodes with subgraphs, and nodes whose inputs are all constants.

Dropout masks (``dropout=``, :data:`~onnx_remat.remat.random_ops.DROPOUT_MODES`): ``byte`` keeps
each replayed Dropout's mask stored as it is (one byte per element); ``packed`` (the default)
makes the mask of every training-mode Dropout in a segment a target too, stored at one bit per
element (:mod:`onnx_remat.remat.mask_packing`) and unpacked when the segment is recomputed, also
for a Dropout whose output is not stored (its mask alone is unpacked; its inputs are not
needed); ``seed`` stores no mask: the Dropout is re-drawn from a seed
(:mod:`onnx_remat.remat.random_ops`). A segment's ``masks`` and ``mask_bytes`` say what its masks
cost in storage.
A segment whose clones would not lower memory (the stored bytes it releases do not exceed the
bytes of boundary tensors it must keep alive longer) is skipped and reported.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import numpy as np
import onnx_graphsurgeon as gs

from onnx_remat.analysis.regions import TrainingGraph, producer, unique_tensors
from onnx_remat.analysis.scopes import ScopeTree
from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.errors import RematError
from onnx_remat.ortsim.kernels import written_inputs
from onnx_remat.ortsim.rewrites.transpose import PUSHED_THROUGH
from onnx_remat.remat.mask_packing import can_pack, default_opset, packed_nbytes
from onnx_remat.remat.random_ops import (
    DEFAULT_DROPOUT,
    check_dropout_mode,
    is_random,
    is_replayable,
    is_seedable_gradient,
)

if TYPE_CHECKING:
    from onnx_remat.analysis.model import ModelAnalysis

SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})
_TRANSPOSE_FUSING = frozenset({"MatMul", "FusedMatMul", "Gemm", "TransposeMatMul"})


def _is_scalar_constant(t: gs.Tensor) -> bool:
    return isinstance(t, gs.Constant) and int(np.prod(t.shape)) == 1


@dataclass
class Selection:
    """What the user asked to recompute."""

    scopes: list[str] = field(default_factory=list)
    op_types: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    recompute_outputs: bool = False

    def is_empty(self) -> bool:
        return not (self.scopes or self.op_types or self.nodes)


@dataclass(eq=False)
class Segment:
    """One recompute unit: cloned together, behind one barrier, when the backward pass reaches it."""

    label: str
    kind: str  # "scope", "op" or "node"
    scopes: list[str]
    recompute: list[gs.Node]  # nodes to clone, topological order
    targets: list[gs.Tensor]  # stashed tensors whose backward readers switch to the clones
    boundary: list[gs.Tensor]  # tensors the clones read from storage
    kept: list[gs.Tensor]  # stashed tensors of the segment that stay stored
    # Stored bytes freed after the forward pass, counting the tensors of known size; when
    # ``unknown_sizes`` is not empty the true figure differs by those tensors' bytes.
    released_bytes: int = 0
    target_bytes: int = 0
    extra_boundary_bytes: int = 0  # boundary bytes kept alive only because of recompute
    unknown_sizes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    group: str | None = None  # stages of one --recompute-outputs group share it
    # Boundary tensors this segment reads from the clone that an earlier segment of the plan makes
    # (a target of that segment), not from storage: the budget planner's boundaries recomputed once
    # and shared (:mod:`onnx_remat.remat.budget`). Empty for every selection-made plan.
    from_clones: list[str] = field(default_factory=list)
    dropout: str = DEFAULT_DROPOUT  # how replayed dropout masks are kept: packed, seed or byte
    masks: list[gs.Tensor] = field(default_factory=list)  # masks of the Dropouts the clones replay
    # Bytes stored per mask in ``masks`` (one per element, one bit per element, or none); a mask of
    # unknown size is missing here and listed in ``unknown_sizes``.
    mask_storage: dict[str, int] = field(default_factory=dict)

    @property
    def mask_bytes(self) -> int:
        """Bytes stored for the dropout masks this segment's clones replay."""
        return sum(self.mask_storage.values())

    def summary(self) -> dict:
        """JSON-ready description (used in the model's metadata and in reports)."""
        return {
            "label": self.label,
            "kind": self.kind,
            "scopes": self.scopes,
            "cloned_nodes": len(self.recompute),
            "cloned_ops": _op_histogram(self.recompute),
            "targets": [t.name for t in self.targets],
            "boundary": [t.name for t in self.boundary],
            "kept": [t.name for t in self.kept],
            "released_bytes": self.released_bytes,
            "unknown_sizes": self.unknown_sizes,
            "notes": self.notes,
            "group": self.group,
            "from_clones": self.from_clones,
            "dropout": self.dropout,
            "masks": [t.name for t in self.masks],
            "mask_bytes": self.mask_bytes,
        }


@dataclass
class SkippedSegment:
    label: str
    reason: str


@dataclass
class RecomputePlan:
    """The segments to rewrite, and what was matched but left alone (with reasons)."""

    segments: list[Segment]
    skipped: list[SkippedSegment] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    dropout: str = DEFAULT_DROPOUT
    # Declared shape (ints or symbols) of every mask the segments replay; None if unknown.
    mask_shapes: dict[str, tuple | None] = field(default_factory=dict)

    @property
    def released_bytes(self) -> int:
        """Stored bytes released, over tensors of known size (see :attr:`unknown_sizes`)."""
        return sum(s.released_bytes for s in self.segments)

    @property
    def unknown_sizes(self) -> list[str]:
        """Tensors whose size is unknown, so not counted in :attr:`released_bytes`."""
        return sorted({n for s in self.segments for n in s.unknown_sizes})

    @property
    def masks(self) -> list[str]:
        """Names of the dropout masks the segments replay, each once."""
        return list(dict.fromkeys(t.name for s in self.segments for t in s.masks))

    @property
    def mask_bytes(self) -> int:
        """Bytes stored for :attr:`masks` (a mask several segments replay counts once)."""
        seen: dict[str, int] = {}
        for s in self.segments:
            seen.update(s.mask_storage)
        return sum(seen.values())


def _op_histogram(nodes: list[gs.Node]) -> dict[str, int]:
    hist: dict[str, int] = {}
    for n in nodes:
        hist[n.op] = hist.get(n.op, 0) + 1
    return hist


class _UnionFind:
    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


class CloneLimitExceeded(RematError):
    """:meth:`Planner.plan` stopped: its scope segments would clone more than ``clone_limit`` nodes."""

    def __init__(self, cloned: int, limit: int):
        super().__init__(f"the plan clones more than {limit} nodes ({cloned} built so far)")
        self.cloned = cloned
        self.limit = limit


class Planner:
    """Builds a :class:`RecomputePlan`; see the module docstring for the semantics."""

    def __init__(
        self,
        tg: TrainingGraph,
        tree: ScopeTree,
        sizes: TensorSizes,
        dropout: str = DEFAULT_DROPOUT,
        moved_transposes: Callable[[list[gs.Node]], set[str]] | None = None,
        built: dict | None = None,
    ):
        """``moved_transposes``: given forward Transposes, the names of those onnxruntime moves in
        this graph (:meth:`~onnx_remat.analysis.model.ModelAnalysis.moved_transposes`); without it
        every Transpose that could be moved is taken as moved (fewer nodes recomputed). ``built``:
        the scope segments other planners of this graph with this ``dropout`` and
        ``moved_transposes`` built, shared with them (:func:`built_segments`); by default this
        planner's own."""
        self.tg = tg
        self._moved_transposes = moved_transposes
        self.tree = tree
        self.sizes = sizes
        self.dropout = check_dropout_mode(dropout)
        self._opset = default_opset(tg.mg.source)
        self._keep_bytes: set[int] = set()  # Dropouts whose masks stay bytes in packed mode
        self._clone_limit: int | None = None  # of the plan() call under way
        self._stashed = {t.name for t in tg.stashed}
        self._cloneable: dict[int, bool] = {}  # by id(node): cloneable(), asked again and again
        self._replayable: dict[int, bool] = {}  # by id(node): replayable()
        # by id(node): whether a replayable Dropout's mask shape and readers let it be packed
        # (_packable; asked 108,000 times by the budget model at 3,850 layers)
        self._pack_fits: dict[int, bool] = {}
        self._transposed: set[int] | None = None  # of _transposed_region(), made at first use
        self._index: tuple[list[gs.Node], dict[str, list[gs.Node]], dict[str, gs.Node]] | None = None
        # by (label, paths): a scope's segment as built, and the Dropouts among its nodes whose masks
        # stayed bytes then, which is all of the planner's state it reads (_scope_segment); every
        # other input is the graph's and the dropout mode's
        self._scope_built: dict[tuple[str, tuple[str, ...]], tuple[frozenset[int], Segment | None]] = (
            built if built is not None else {}
        )
        self._graph_outputs = {t.name for t in tg.graph.outputs}
        # Tensors some node overwrites in place, and by which node: a clone reading one would
        # read the overwritten value.
        self._written: dict[str, int] = {}
        for n in tg.order:
            for i in written_inputs(n.domain, n.op):
                if i < len(n.inputs) and n.inputs[i].name:
                    self._written[n.inputs[i].name] = id(n)

    # -- what may be cloned ------------------------------------------------------------------

    def cloneable(self, node: gs.Node) -> bool:
        """Forward, deterministic (or replayable), no subgraph, not constant-only, and reading no
        tensor that another node overwrites in place (its own in-place outputs the rewrite sends
        to scratch buffers)."""
        # (once per node: the budget model asks it of each node for every option of its unit,
        # 140,000 times at 3,850 layers; the analysis the answer depends on does not change)
        known = self._cloneable.get(id(node))
        if known is None:
            known = self._cloneable[id(node)] = self._judge_cloneable(node)
        return known

    def replayable(self, node: gs.Node) -> bool:
        """:func:`~onnx_remat.remat.random_ops.is_replayable`, once per node (it reads the
        Dropout's mode constant each time; asked 500,000 times at 3,850 layers)."""
        known = self._replayable.get(id(node))
        if known is None:
            known = self._replayable[id(node)] = is_replayable(node)
        return known

    def _judge_cloneable(self, node: gs.Node) -> bool:
        if self.tg.is_backward(node) or node.op in SUBGRAPH_OPS:
            return False
        if any(self._written.get(t.name, id(node)) != id(node) for t in node.inputs if t.name):
            return False
        if not self._layout_free(node):
            return False
        if is_random(node):
            return self.replayable(node)
        data_inputs = [t for t in node.inputs if t.name]
        return any(not isinstance(t, gs.Constant) for t in data_inputs)

    def _layout_free(self, node: gs.Node) -> bool:
        """False for a node whose stored output sits next to a Transpose that onnxruntime may move.

        onnxruntime's TransposeOptimizer pushes Transposes through element-wise ops and cancels
        them against each other, choosing by how many readers each tensor has. Moving a stored
        tensor's backward readers to a clone changes those counts, and can change its choice: then
        later element-wise ops and reductions run in another layout, and a weight gradient is
        summed in another order (seen: a BatchNorm over a transposed sequence, 1e-16 off), or
        Transposes it had cancelled stay and raise the peak. So a stored Transpose output, or a
        stored tensor a Transpose reads, is recomputed only when that Transpose feeds nothing but
        matrix products (into which it is fused whatever the readers), scalar scales or Transposes.
        Nor is a node a Transpose may be pushed into (:meth:`_transposed_region`), or one reading
        a stored tensor made there: the segment's barrier would read a tensor of the region, and
        no Transpose is pushed through a barrier (fuzz model 5169: a Transpose onnxruntime had
        pushed through a GELU's element-wise ops stayed before it, and a weight gradient came out
        3.7e-9 off).
        """
        region = self._transposed_region()
        if id(node) in region:
            return False
        for t in node.inputs:
            # the segment's barrier would read it: a reader no Transpose is pushed through
            p = producer(t) if t.name in self._stashed else None
            if p is not None and id(p) in region:
                return False
        stored = [t for t in node.outputs if t.name in self._stashed]
        if not stored:
            return True
        transposes = [node] if node.op == "Transpose" else []
        transposes += [c for t in stored for c in t.outputs if c.op == "Transpose" and self.tg.is_forward(c)]
        return all(self._fused_transpose(tr) for tr in transposes)

    def _transposed_region(self) -> set[int]:
        """The forward nodes onnxruntime's TransposeOptimizer pushes a Transpose into: each forward
        Transpose that is not fused into matrix products, that it moves in this graph (asked of
        ``moved_transposes``) and that reads into an op it pushes through (:data:`PUSHED_THROUGH`),
        and the forward nodes of those ops reachable from it. One pass over the forward nodes.
        (In the exported transformers of the corpus it moves none: there is no region.)"""
        if self._transposed is not None:
            return self._transposed
        region: set[int] = set()
        tg = self.tg

        def pushed_into(n: gs.Node) -> list[gs.Node]:
            return [
                c
                for t in n.outputs
                for c in t.outputs
                if not c.domain and c.op in PUSHED_THROUGH and tg.is_forward(c) and id(c) not in region
            ]

        # Only Transposes that read into an op a push goes through are asked about: a graph with
        # none (GPT-2's permute before a Reshape, say) is not emulated for the question.
        seeds = [
            n
            for n in tg.order
            if n.op == "Transpose"
            and not n.domain
            and tg.is_forward(n)
            and not self._fused_transpose(n)
            and pushed_into(n)
        ]
        if self._moved_transposes is not None and seeds:
            moved = self._moved_transposes(seeds)
            seeds = [n for n in seeds if n.name in moved]
        for seed in seeds:
            if id(seed) in region:
                continue
            stack = pushed_into(seed)
            if not stack:
                continue
            region.add(id(seed))
            while stack:
                n = stack.pop()
                if id(n) in region:
                    continue
                region.add(id(n))
                if n.op != "Transpose":  # a Transpose cancels or merges with what reaches it
                    stack.extend(pushed_into(n))
        self._transposed = region
        return region

    def _fused_transpose(self, node: gs.Node) -> bool:
        """A forward Transpose whose forward readers are matrix products, scalar scales or Transposes."""
        for t in node.outputs:
            for c in t.outputs:
                if self.tg.is_backward(c) or c.op in _TRANSPOSE_FUSING or c.op == "Transpose":
                    continue
                if c.op in ("Mul", "Div") and any(_is_scalar_constant(x) for x in c.inputs if x is not t):
                    continue
                return False
        return True

    def _is_source(self, t: gs.Tensor) -> bool:
        """Graph inputs, initializers and omitted optional inputs: always available."""
        return not t.name or isinstance(t, gs.Constant) or producer(t) is None

    # -- building segments -------------------------------------------------------------------

    def plan(self, selection: Selection, *, clone_limit: int | None = None) -> RecomputePlan:
        """Plan segments for ``selection``. Raises :class:`RematError` for selections matching nothing.

        ``clone_limit``: raise :class:`CloneLimitExceeded` as soon as the scope segments built so
        far clone more nodes than this (the stages of a long ``--recompute-outputs`` chain clone
        O(layers^2) nodes: a caller that would discard such a plan stops before building it).
        """
        if selection.is_empty():
            raise RematError("nothing selected: give --scope, --op-type or --node")
        self._clone_limit = clone_limit
        kept, skipped, notes = self._build(selection)
        if self.dropout == "packed":
            # The segment the backward pass recomputes first needs its masks right after the
            # forward pass ends, where memory is highest: unpacking them there costs more (the mask
            # again, plus scratch that onnxruntime's planner then keeps for every later unpack)
            # than their bytes saved in the forward pass's last layers. They stay bytes.
            first = self._first_in_backward(kept)
            # Its own masks: the targets its backward readers need (a stage of --recompute-outputs
            # replays the earlier blocks' Dropouts too; their masks are needed later).
            hold = (
                [p for t in first.targets if self._is_mask(t) and (p := producer(t)) is not None and self._packable(p)]
                if first is not None
                else []
            )
            if first is not None and hold:
                self._keep_bytes.update(id(n) for n in hold)
                kept, skipped, notes = self._build(selection)
                names = ", ".join(n.name or n.op for n in hold)
                notes.append(
                    f"dropout mask{'s' if len(hold) > 1 else ''} of {names} kept at one byte per element: segment "
                    f"{first.label} is recomputed first, right after the forward pass, where unpacking costs more "
                    "than packing saves"
                )
        shapes = {t.name: self.sizes.raw_dims(t.name) for s in kept for t in s.masks}
        return RecomputePlan(segments=kept, skipped=skipped, notes=notes, dropout=self.dropout, mask_shapes=shapes)

    def _build(self, selection: Selection) -> tuple[list[Segment], list[SkippedSegment], list[str]]:
        segments: list[Segment] = []
        notes: list[str] = []
        if selection.scopes:
            segments += self._scope_segments(selection.scopes, selection.recompute_outputs, notes)
        if selection.op_types or selection.nodes:
            segments += self._node_segments(selection.op_types, selection.nodes, notes)
        segments = self._merge_overlapping(segments)
        segments = self._settle_shared_boundaries(segments, notes)
        kept: list[Segment] = []
        skipped: list[SkippedSegment] = []
        for seg in segments:
            self._account(seg)
            reason = self._skip_reason(seg)
            if reason:
                skipped.append(SkippedSegment(seg.label, reason))
            else:
                kept.append(seg)
        # In forward order of what they release (stages of a group share their first clones).
        kept.sort(key=lambda s: min(self.tg.position[id(producer(t))] for t in s.targets))
        return kept, skipped, notes

    @property
    def masks_kept_as_bytes(self) -> frozenset[int]:
        """The Dropouts (by node id) whose masks every later segment keeps at one byte per element in
        packed mode: those the plans made so far kept (:meth:`plan`: the segment recomputed first)."""
        return frozenset(self._keep_bytes)

    def keep_masks_as_bytes(self, nodes: Iterable[int]) -> None:
        """Keep the masks of these Dropouts (by node id) at one byte per element in every later
        segment: as a plan that chose so on another planner of the same graph (its
        :attr:`masks_kept_as_bytes`) would have made this one do."""
        self._keep_bytes.update(nodes)

    def _first_in_backward(self, segments: list[Segment]) -> Segment | None:
        """The segment whose first backward reader comes first (the backward pass recomputes it first)."""
        best: tuple[int, Segment] | None = None
        for seg in segments:
            readers = [self.tg.position[id(c)] for t in seg.targets for c in self.tg.backward_consumers(t)]
            if readers and (best is None or min(readers) < best[0]):
                best = (min(readers), seg)
        return best[1] if best is not None else None

    def scope_segment(self, scope) -> Segment | None:
        """The accounted segment recomputing ``scope`` alone (None if it stores nothing recomputable)."""
        seg = self._scope_segment(scope.path, [scope.path], scope.all_nodes())
        if seg is not None:
            self._account(seg)
        return seg

    def _scope_segments(self, patterns: list[str], recompute_outputs: bool, notes: list[str]) -> list[Segment]:
        match = self.tree.match(patterns)
        for inner, outer in match.nested:
            notes.append(
                f"scope {inner.path} is inside {outer.path} (also matched): recomputed as part of {outer.path}"
            )
        scopes = match.scopes
        members = [s.all_nodes() for s in scopes]
        groups = [[i] for i in range(len(scopes))]
        if recompute_outputs and len(scopes) > 1:
            uf = _UnionFind(len(scopes))
            owner = {id(n): i for i, nodes in enumerate(members) for n in nodes}
            for i, nodes in enumerate(members):
                for n in nodes:
                    for out in n.outputs:
                        for c in out.outputs:
                            j = owner.get(id(c))
                            if j is not None and j != i:
                                uf.union(i, j)
            by_root: dict[int, list[int]] = {}
            for i in range(len(scopes)):
                by_root.setdefault(uf.find(i), []).append(i)
            groups = list(by_root.values())
        segments: list[Segment] = []
        cloned = 0
        for g in groups:
            nodes = [n for i in g for n in members[i]]
            paths = [scopes[i].path for i in g]
            label = paths[0] if len(paths) == 1 else f"{paths[0]}..{paths[-1]}"
            if len(g) == 1:
                seg = self._scope_segment(label, paths, nodes)
                staged = [seg] if seg is not None else []
            else:
                staged = self._staged_group(label, [scopes[i] for i in g], nodes, notes, cloned)
            cloned += sum(len(s.recompute) for s in staged)
            self._check_clones(cloned)
            if not staged:
                notes.append(
                    f"scope {label}: no stored activation can be recomputed (none is read by the "
                    "backward pass, or each is the scope's output, random, or next to a Transpose)"
                )
            segments.extend(staged)
        return segments

    def _check_clones(self, cloned: int) -> None:
        if self._clone_limit is not None and cloned > self._clone_limit:
            raise CloneLimitExceeded(cloned, self._clone_limit)

    def _staged_group(
        self, label: str, scopes, nodes: list[gs.Node], notes: list[str], cloned: int = 0
    ) -> list[Segment]:
        """Merged scopes (``--recompute-outputs``): their outputs are not stored either.

        The group is recomputed in *stages*, one per scope: each stage recomputes, when the backward
        pass reaches it, the activations its backward readers need, starting from what the group
        keeps stored (its inputs, dropout masks). A stage reaches back through the earlier scopes'
        outputs, which are no longer stored, so those are recomputed once per stage: more compute
        (up to n(n+1)/2 scope recomputes for a chain of n) for a peak that does not hold the whole
        group's activations at once.
        """
        paths = [s.path for s in scopes]
        candidates, targets, kept = self._scope_candidates(nodes)
        if not targets:
            return []
        # Scopes in forward order; a target joins the stage of the latest scope that reads it in
        # the forward pass (its producer's, or the next scope's for a scope output): the backward
        # pass reaches that scope first.
        # (Ordered by each scope's last node: parameter-only nodes may be scheduled first.)
        last_node = {s.path: max(self.tg.position[id(n)] for n in s.all_nodes()) for s in scopes}
        paths = sorted(paths, key=lambda p: last_node[p])
        rank = {p: i for i, p in enumerate(paths)}
        owner = {id(n): s.path for s in scopes for n in s.all_nodes()}
        assigned: dict[str, list[gs.Tensor]] = {p: [] for p in paths}
        for t in targets:
            readers = [rank[owner[id(c)]] for c in t.outputs if self.tg.is_forward(c) and id(c) in owner]
            assigned[paths[max([rank[owner[id(producer(t))]]] + readers)]].append(t)
        stage_paths = [p for p in paths if assigned[p]]
        stages = []
        for path in stage_paths:
            seg = self._segment(path, "scope", [path], assigned[path], lambda n: id(n) in candidates, kept)
            if seg is not None:
                seg.group = label
                stages.append(seg)
                cloned += len(seg.recompute)
                self._check_clones(cloned)  # before the next stage, which clones more than this one
        scope_nodes = sum(len(s.recompute) for s in stages)
        group_nodes = len(candidates)
        notes.append(
            f"--recompute-outputs merged {' + '.join(paths)} ({label}): their outputs are not stored; "
            f"{len(stages)} stages each recompute from the group's stored inputs when the backward pass "
            f"reaches them ({scope_nodes} nodes cloned for {group_nodes} recomputable nodes)"
        )
        return stages

    def _scope_candidates(self, nodes: list[gs.Node]):
        """(candidate node ids, targets, kept) of a scope or merged scopes: see the module docstring."""
        inside = {id(n) for n in nodes}
        output_nodes = set()
        for n in nodes:
            for out in n.outputs:
                if out.name in self._graph_outputs or any(
                    self.tg.is_forward(c) and id(c) not in inside for c in out.outputs
                ):
                    output_nodes.add(id(n))
                    break
        candidates = {id(n) for n in nodes if id(n) not in output_nodes and self.cloneable(n)}
        # A Dropout whose output leaves the scope stays stored, but a mask that comes back without
        # the Dropout's inputs (unpacked, or redrawn by its gradient) is released all the same.
        candidates |= {id(n) for n in nodes if id(n) in output_nodes and self._mask_alone(n)}
        targets = [t for n in nodes if id(n) in candidates for t in self._recomputable_outputs(n)]
        targets = [t for t in targets if id(producer(t)) not in output_nodes or self._is_mask(t)]
        target_names = {t.name for t in targets}
        kept = [t for n in nodes for t in n.outputs if t.name in self._stashed and t.name not in target_names]
        return candidates, targets, kept

    def _scope_segment(self, label: str, paths: list[str], nodes: list[gs.Node]) -> Segment | None:
        """The segment recomputing one scope (or scopes merged under ``label``) of ``nodes``: a new
        Segment, built once per planner and state of the masks kept as bytes among ``nodes``.

        A scope's segment reads the planner's state only through which of ``nodes`` keep their
        masks as bytes (:meth:`_packable`: the candidates, the targets, the boundary). :meth:`plan`
        builds every segment a second time when the segment recomputed first keeps its masks as
        bytes, and every other scope's segment is then the same (0.5 s at 10^5 nodes): it is
        copied from the first build, not built again; so is a segment another planner of the graph
        built (``built``: the scope table after ``apply`` in ``estimate``)."""
        key = (label, tuple(paths))
        held = frozenset(k for k in map(id, nodes) if k in self._keep_bytes) if self._keep_bytes else frozenset()
        built = self._scope_built.get(key)
        if built is not None and built[0] == held:
            return _fresh(built[1])
        candidates, targets, kept = self._scope_candidates(nodes)
        seg = self._segment(label, "scope", paths, targets, lambda n: id(n) in candidates, kept)
        self._scope_built[key] = (held, _fresh(seg))
        return seg

    def _node_segments(self, op_types: list[str], names: list[str], notes: list[str]) -> list[Segment]:
        selected = self._select_nodes(op_types, names)
        targets_by_node = []
        for n in selected:
            outs = self._recomputable_outputs(n) if self.cloneable(n) else []
            if not outs:
                why = (
                    "its outputs are not kept for the backward pass"
                    if self.cloneable(n)
                    else "it cannot be recomputed (random, constant-only or with a subgraph)"
                )
                notes.append(f"node {n.name or n.op}: nothing to recompute ({why})")
                continue
            targets_by_node.append((n, outs))
        selected_targets = {t.name for _, outs in targets_by_node for t in outs}
        # Stashed tensors that are themselves selected are pulled in (recomputed), not read.
        expandable = lambda n: (
            self.cloneable(n)
            and (all(o.name not in self._stashed or o.name in selected_targets for o in n.outputs if o.name))
        )
        segments = []
        for n, outs in targets_by_node:
            kind = "node" if n.name in names else "op"
            seg = self._segment(n.name or n.op, kind, [], outs, expandable, [])
            if seg is not None:
                segments.append(seg)
        return segments

    def _node_index(self) -> tuple[list[gs.Node], dict[str, list[gs.Node]], dict[str, gs.Node]]:
        """Forward nodes, forward nodes by op type, and every node by name: built once per planner,
        since the budget planner selects nodes thousands of times on one graph."""
        if self._index is None:
            forward = self.tg.forward_nodes
            by_op: dict[str, list[gs.Node]] = {}
            for n in forward:
                by_op.setdefault(n.op, []).append(n)
            self._index = (forward, by_op, {n.name: n for n in self.tg.order})
        return self._index

    def _select_nodes(self, op_types: list[str], names: list[str]) -> list[gs.Node]:
        forward, by_op, by_name = self._node_index()
        selected: dict[int, gs.Node] = {}
        for op in op_types:
            hits = by_op.get(op, [])
            if not hits:
                present_ops = sorted(by_op)
                close = difflib.get_close_matches(op, present_ops, n=3)
                hint = (
                    f"; closest: {', '.join(close)}" if close else f"; forward op types: {', '.join(present_ops[:12])}"
                )
                raise RematError(f"op type {op!r} matches no forward node{hint}")
            selected.update((id(n), n) for n in hits)
        if names:
            for name in names:
                node = by_name.get(name)
                if node is None:
                    close = difflib.get_close_matches(name, [n.name for n in forward if n.name], n=3)
                    hint = f"; closest: {', '.join(close)}" if close else ""
                    raise RematError(f"no node named {name!r}{hint}")
                if self.tg.is_backward(node):
                    raise RematError(f"node {name!r} is a gradient node; only forward nodes can be recomputed")
                selected[id(node)] = node
        return sorted(selected.values(), key=lambda n: self.tg.position[id(n)])

    def _recomputable_outputs(self, node: gs.Node) -> list[gs.Tensor]:
        """Stashed outputs of ``node`` that a clone can reproduce (a dropout mask when not kept as bytes)."""
        if self.replayable(node):
            outs = node.outputs[:1]
            if self.dropout == "seed" or self._packable(node):
                outs = node.outputs[:2]
        else:
            outs = node.outputs
        return [t for t in outs if t.name in self._stashed]

    def _mask_alone(self, node: gs.Node) -> bool:
        """Whether the mask of this replayable Dropout comes back without the Dropout's inputs:
        unpacked (``packed``), or redrawn by its gradient nodes themselves (``seed``)."""
        if self.dropout == "packed":
            return self._packable(node)
        if self.dropout == "seed":
            return self._redrawable(node)
        return False

    def _redrawable(self, node: gs.Node) -> bool:
        """A replayable Dropout whose mask only ``DropoutGrad`` nodes read: with ``seed`` each becomes a
        Dropout of its gradient input with the same seed (:mod:`onnx_remat.remat.random_ops`)."""
        if not self.replayable(node):
            return False
        readers = node.outputs[1].outputs
        return bool(readers) and all(
            is_seedable_gradient(c, node.outputs[1]) and self.tg.is_backward(c) for c in readers
        )

    def _packable(self, node: gs.Node) -> bool:
        """A replayable Dropout whose mask can be packed: this opset and shape allow it, and a forward
        node reads its output (the packing runs before that reader, see the rewrite)."""
        if self.dropout != "packed" or not self.replayable(node) or id(node) in self._keep_bytes:
            return False
        fits = self._pack_fits.get(id(node))
        if fits is None:  # (the analysis it reads does not change)
            fits = self._pack_fits[id(node)] = can_pack(self.sizes.raw_dims(node.outputs[1].name), self._opset) and any(
                self.tg.is_forward(c) for c in node.outputs[0].outputs
            )
        return fits

    def _is_mask(self, t: gs.Tensor) -> bool:
        p = producer(t)
        return p is not None and self.replayable(p) and t is p.outputs[1]

    def _replays_output(self, node: gs.Node, inside: set[int], target_names: set[str]) -> bool:
        """Whether a segment recomputing ``node`` (a replayable Dropout) needs its output, and so its
        inputs; a packed mask alone is unpacked without them."""
        if not self._mask_alone(node):
            return True
        out = node.outputs[0]
        return out.name in target_names or any(id(c) in inside for c in out.outputs)

    def _segment(self, label, kind, paths, targets, expandable, kept) -> Segment | None:
        """Close ``targets`` over their producers while ``expandable``; the rest is boundary.

        A Dropout reached only through its mask is recomputed without its inputs when the mask comes
        back alone (:meth:`_mask_alone`); reached through its output (a target, or read by another
        recomputed node) it is replayed from its inputs.
        """
        if not targets:
            return None
        chosen: dict[int, gs.Node] = {}
        expanded: set[int] = set()
        mask_only = lambda p, t: self._is_mask(t) and self._mask_alone(p)
        stack = [(p, not mask_only(p, t)) for t in targets if (p := producer(t)) is not None]
        while stack:
            node, full = stack.pop()
            chosen[id(node)] = node
            if not full or id(node) in expanded:
                continue
            expanded.add(id(node))
            for t in node.inputs:
                p = producer(t) if t.name else None
                if p is not None and id(p) not in expanded and expandable(p):
                    stack.append((p, not mask_only(p, t)))
        target_names = {t.name for t in targets}
        recompute = sorted(chosen.values(), key=lambda n: self.tg.position[id(n)])
        return Segment(
            label=label,
            kind=kind,
            scopes=list(paths),
            recompute=recompute,
            targets=list(targets),
            boundary=self._boundary(recompute, target_names),
            kept=unique_tensors(kept),
            dropout=self.dropout,
            masks=[n.outputs[1] for n in recompute if self.replayable(n)],
        )

    def _boundary(self, recompute: list[gs.Node], target_names: set[str]) -> list[gs.Tensor]:
        inside = {id(n) for n in recompute}
        seen: dict[str, gs.Tensor] = {}
        for n in recompute:
            inputs = list(n.inputs)
            if self.replayable(n):
                if self.dropout == "byte" or (self.dropout == "packed" and not self._packable(n)):
                    inputs.append(n.outputs[1])  # the replay reads the mask stored as it is
                elif not self._replays_output(n, inside, target_names):
                    inputs = []  # the packed mask alone is unpacked (it is no boundary tensor)
            for t in inputs:
                if not t.name or t.name in seen:
                    continue
                p = producer(t)
                if p is None or id(p) not in inside or (self.replayable(n) and t is n.outputs[1]):
                    seen[t.name] = t
        return list(seen.values())

    def _merge_overlapping(self, segments: list[Segment]) -> list[Segment]:
        """Segments that clone the same node become one."""
        if len(segments) < 2:
            return segments
        uf = _UnionFind(len(segments))
        owner: dict[int, int] = {}
        for i, seg in enumerate(segments):
            for n in seg.recompute:
                j = owner.setdefault(id(n), i)
                if j != i and not (seg.group is not None and seg.group == segments[j].group):
                    uf.union(i, j)  # stages of one group clone the same nodes on purpose
        groups: dict[int, list[Segment]] = {}
        for i, seg in enumerate(segments):
            groups.setdefault(uf.find(i), []).append(seg)
        merged = []
        for group in groups.values():
            if len(group) == 1:
                merged.append(group[0])
                continue
            nodes = {id(n): n for s in group for n in s.recompute}
            recompute = sorted(nodes.values(), key=lambda n: self.tg.position[id(n)])
            first = group[0]
            targets = unique_tensors([t for s in group for t in s.targets])
            merged.append(
                Segment(
                    label=first.label if len(group) == 1 else f"{first.label}+{len(group) - 1}",
                    kind=first.kind,
                    scopes=[p for s in group for p in s.scopes],
                    recompute=recompute,
                    targets=targets,
                    boundary=self._boundary(recompute, {t.name for t in targets}),
                    kept=unique_tensors([t for s in group for t in s.kept]),
                    notes=[f"merged {', '.join(s.label for s in group)}: they recompute shared nodes"],
                    dropout=self.dropout,
                    masks=[n.outputs[1] for n in recompute if self.replayable(n)],
                )
            )
        return merged

    def _settle_shared_boundaries(self, segments: list[Segment], notes: list[str]) -> list[Segment]:
        """A tensor one segment reads from storage cannot be released by another: keep it stored."""
        for _ in range(len(segments) + 1):
            needed = {t.name for s in segments for t in s.boundary}
            changed = False
            for seg in segments:
                demoted = [t for t in seg.targets if t.name in needed]
                if not demoted:
                    continue
                changed = True
                for t in demoted:
                    notes.append(f"{t.name} stays stored: another segment reads it from storage")
                seg.targets = [t for t in seg.targets if t.name not in needed]
                seg.kept = unique_tensors(seg.kept + demoted)
                if seg.targets:
                    keep = {id(n) for n in seg.recompute}
                    rebuilt = self._segment(
                        seg.label, seg.kind, seg.scopes, seg.targets, lambda n, keep=keep: id(n) in keep, seg.kept
                    )
                    assert rebuilt is not None  # seg.targets is not empty
                    seg.recompute, seg.boundary, seg.masks = rebuilt.recompute, rebuilt.boundary, rebuilt.masks
            segments = [s for s in segments if s.targets]
            if not changed:
                break
        return segments

    # -- memory accounting -------------------------------------------------------------------

    def _account(self, seg: Segment) -> None:
        """Bytes released: stored targets, less boundary tensors kept alive longer and packed masks."""
        unknown: list[str] = []
        target_bytes = 0
        for t in seg.targets:
            b = self.sizes.nbytes(t.name)
            if b is None:
                unknown.append(t.name)
            else:
                target_bytes += b
        seg.mask_storage = {}
        for t in seg.masks:
            b = self.sizes.nbytes(t.name)
            if b is None:
                if t.name not in unknown:
                    unknown.append(t.name)
                continue
            seg.mask_storage[t.name] = self._stored_mask_bytes(t, b)
        target_names = {t.name for t in seg.targets}
        # A packed mask this segment releases is stored as bits instead.
        packed_here = sum(b for name, b in seg.mask_storage.items() if name in target_names)
        extra = 0
        for t in seg.boundary:
            if self._is_source(t) or t.name in self._stashed:
                continue  # alive for the backward pass anyway
            b = self.sizes.nbytes(t.name)
            if b is None:
                unknown.append(t.name)
            else:
                extra += b
        seg.target_bytes = target_bytes
        seg.extra_boundary_bytes = extra
        seg.unknown_sizes = unknown
        seg.released_bytes = target_bytes - extra - packed_here

    def _stored_mask_bytes(self, mask: gs.Tensor, nbytes: int) -> int:
        """Bytes the graph stores for a replayed Dropout's ``mask`` of ``nbytes`` bytes as bool."""
        if mask.name not in self._stashed:
            return 0
        node = producer(mask)
        if self.dropout == "seed":
            return 0
        if self.dropout == "packed" and node is not None and self._packable(node):
            return packed_nbytes(nbytes)
        return nbytes

    def _skip_reason(self, seg: Segment) -> str | None:
        if not seg.unknown_sizes and seg.released_bytes <= 0:
            return (
                f"would not lower memory: releases {seg.target_bytes} B of stored activations but keeps "
                f"{seg.extra_boundary_bytes} B of its inputs alive until the backward pass"
                + (
                    f" and stores {seg.mask_bytes} B of packed dropout masks"
                    if self.dropout == "packed" and seg.mask_bytes
                    else ""
                )
            )
        return None


def planner_of(analysis: ModelAnalysis, dropout: str | None = None) -> Planner:
    """The :class:`Planner` of an analysed graph (its training graph, scopes, sizes and the
    Transposes onnxruntime moves in it) for ``dropout`` (None: the default mode), sharing the
    scope segments the other planners of the analysis built (:func:`built_segments`)."""
    dropout = dropout if dropout is not None else DEFAULT_DROPOUT
    return Planner(
        analysis.graph,
        analysis.scopes,
        analysis.sizes,
        dropout=dropout,
        moved_transposes=analysis.moved_transposes,
        built=built_segments(analysis.memo, dropout),
    )


def built_segments(memo: dict[str, object], dropout: str) -> dict:
    """The scope segments built on one analysed graph (``memo``: its
    :attr:`~onnx_remat.analysis.model.ModelAnalysis.memo`) for ``dropout``, for :class:`Planner`'s
    ``built``: a segment is a function of the graph, the dropout mode and which masks stay bytes
    (which its key holds), so the planners of one command share them."""
    return cast("dict", memo.setdefault(f"scope_segments/{check_dropout_mode(dropout)}", {}))


def _fresh(seg: Segment | None) -> Segment | None:
    """A copy of ``seg`` whose lists and dicts are its own (the planner's later steps reassign and
    fill a segment's fields), holding the same graph nodes and tensors."""
    if seg is None:
        return None
    return dataclasses.replace(
        seg,
        scopes=list(seg.scopes),
        recompute=list(seg.recompute),
        targets=list(seg.targets),
        boundary=list(seg.boundary),
        kept=list(seg.kept),
        unknown_sizes=list(seg.unknown_sizes),
        notes=list(seg.notes),
        from_clones=list(seg.from_clones),
        masks=list(seg.masks),
        mask_storage=dict(seg.mask_storage),
    )


def nothing_to_recompute(recompute_plan: RecomputePlan) -> str:
    """The one-line reason why a plan has no segment: each kind of reason once, with what it is about."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for s in recompute_plan.skipped:
        groups.setdefault(s.reason.split(":")[0], []).append((f"segment {s.label}", s.reason))
    for note in recompute_plan.notes:
        if "nothing to recompute" not in note and "no stored activation" not in note:
            continue
        what, _, why = note.partition(": ")
        groups.setdefault(why.split(" (")[0], []).append((what, why))
    parts = []
    for head, items in groups.items():
        if len(items) == 1:
            parts.append(f"{items[0][0]}: {items[0][1]}")
        else:
            kind = items[0][0].split()[0]
            example = items[0][1][len(head) :].lstrip(": ")
            detail = f" (e.g. {items[0][0].split(' ', 1)[-1]}: {example})" if example else ""
            parts.append(f"{len(items)} {kind}s ({_span([w for w, _ in items])}): {head}{detail}")
    if not parts:
        parts = ["the selection holds no activation the backward pass reads"]
    return "nothing to recompute: " + "; ".join(parts)


def _span(whats: list[str]) -> str:
    names = [w.split(" ", 1)[-1] for w in whats]
    return ", ".join(names) if len(names) <= 3 else f"{names[0]} … {names[-1]}"
