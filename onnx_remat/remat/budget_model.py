"""The budget planner's cheap memory and compute model of a training graph.

Input: a :class:`~onnx_remat.analysis.model.ModelAnalysis`, per-node costs
(:mod:`onnx_remat.remat.cost`) and ONE exact estimate of the unrewritten graph (its execution
order and memory plan, :mod:`onnx_remat.estimate`). Output: a :class:`BudgetModel`: the graph as a
sequence of *units* in forward order, what each way of recomputing a unit costs and keeps stored,
and the memory each part of the step needs, in numbers the solvers (:mod:`onnx_remat.remat.solve`)
work on. Building it runs no estimate beyond the one given.

Units. The scopes of repeated layers (:meth:`~onnx_remat.analysis.scopes.ScopeTree.repeated_layers`,
the innermost such scopes) are units; so are the largest other scopes that hold none of them
(embeddings, heads, a final norm). Nodes in no unit (the loss, a root-level add) are never
recomputed. A unit's *boundary* is what it stores that later units read in the forward pass (a
block's output). Consecutive units of one repeated layer whose boundary only the next one reads
*chain*: their boundaries may be dropped and recomputed from an earlier one
(:mod:`onnx_remat.remat.solve`'s rotor schedules).

Options of a unit (each a list of :class:`~onnx_remat.remat.plan.Segment` made by the
:class:`~onnx_remat.remat.plan.Planner`): ``store`` (nothing recomputed), ``cheap`` (op-level
recompute of the stored tensors whose recompute runs no matrix product or convolution, e.g. a
dropout output replayed from its mask, a normalization, an activation), one option per child scope
(``scope:<path>``, e.g. the attention alone), and ``layer`` (the whole unit but its outputs, as
``--scope`` does).

Memory. The baseline estimate gives the bytes alive at every step, ``L(t)``, and which unit's
forward tensors hold them. Steps are put in *slots*: before any unit (``pre``), the forward pass
of unit k (``FW_k``), between the last unit's forward and its backward (``mid``), the backward
pass of unit k (``BW_k``, from the first backward reader of what k stores), and after (``post``).
In training graphs the backward pass runs the units in reverse, so while unit k runs forward or
backward, the units before it hold exactly what they store past their forward pass (*kept* bytes
and their boundary) and the units after it hold nothing: the peak after a plan is about

    max over slots of  L'(t) + sum over units j before the slot's unit of (kept_j + boundary_j)

where ``L'(t) = L(t) - (what all units hold at t) + (what the slot's own unit holds at t)``, read
off the baseline estimate, plus what the slot's recompute adds (its clones that no backward node
reads, alive while the recompute runs). That is a knapsack with nested prefix constraints, which
:mod:`onnx_remat.remat.solve` solves exactly. It is approximate where onnxruntime's planner is not
additive (buffers reused by shape, fragmentation): :mod:`onnx_remat.remat.budget` checks every plan
with the exact estimator and tightens the model's budget until the plan fits.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from onnx_remat.analysis.model import ModelAnalysis
from onnx_remat.analysis.regions import producer
from onnx_remat.analysis.scopes import Scope
from onnx_remat.ortsim.kernels import alias_input, inplace_inputs
from onnx_remat.ortsim.planner import align
from onnx_remat.remat.cost import CONVS, MATMULS, NodeCosts
from onnx_remat.remat.plan import Planner, Segment, planner_of
from onnx_remat.remat.random_ops import is_replayable

STORE, CHEAP, LAYER = "store", "cheap", "layer"
EXPENSIVE_OPS = MATMULS | CONVS


@dataclass
class Option:
    """One way to treat a unit on its own: the segments, what they cost and what stays stored."""

    kind: str  # store, cheap, layer or scope:<path>
    segments: list[Segment]
    cost: float  # seconds the clones add per step
    kept: int  # bytes the unit stores past its forward pass with this option, boundary excluded
    released: int  # stored bytes the option releases (net of what it keeps for its recompute)
    targets: int = 0  # bytes of the unit's stored tensors its clones replace
    peak: int = 0  # bytes its recompute allocates at most while it runs (targets included)
    extra: int = 0  # of ``kept``, inputs it keeps alive for its recompute that are not stored anyway

    def event_need(self, unit: Unit) -> int:
        """Bytes alive (the units before excluded) while this option's recompute runs."""
        if not self.segments:
            return 0
        return unit.event_own - self.targets + self.peak

    def need(self, unit: Unit) -> int:
        """Bytes alive in the unit's backward slot with this option (the units before excluded)."""
        return max(unit.bw_need, self.event_need(unit))


@dataclass
class Unit:
    """A scope in the forward sequence (see the module docstring)."""

    index: int
    scope: Scope
    nodes: list[gs.Node]
    stored: list[gs.Tensor]  # stashed tensors produced here
    boundary: list[gs.Tensor]  # stored tensors later units read in the forward pass
    stored_bytes: int
    boundary_bytes: int  # of the boundary, what the unit stores for the backward pass anyway
    hold_bytes: int  # the whole boundary: what a rotor group holds when it recomputes it
    options: list[Option] = field(default_factory=list)
    chain: int | None = None  # index of its repeated-layer chain
    joins_next: bool = False  # may be recomputed together with the next unit (rotor groups)
    forward_cost: float = 0.0  # a full forward of the unit (to recompute its boundary)
    advance: int = 0  # bytes alive inside the unit while a forward recompute runs through it
    # from the baseline estimate (bytes):
    fw_need: int = 0  # max over FW_k of L'(t)
    bw_need: int = 0  # max over BW_k of L'(t)
    event_own: int = 0  # L'(t) at the first step of BW_k (where recomputes run)
    event_ext: int = 0  # the same without the unit's own tensors
    fw_steps: tuple[int, int] = (0, -1)
    bw_steps: tuple[int, int] = (0, -1)

    @property
    def path(self) -> str:
        return self.scope.path

    def option(self, kind: str) -> Option | None:
        return next((o for o in self.options if o.kind == kind), None)


@dataclass
class BudgetModel:
    """Units, their options, and the memory the rest of the step needs (see the module docstring)."""

    analysis: ModelAnalysis
    costs: NodeCosts
    planner: Planner
    units: list[Unit]
    baseline_peak: int  # the exact planned peak of the unrewritten graph
    baseline_live_peak: int
    mid_need: int  # max over the mid slot of L'(t) (no unit of its own)
    outside_need: int  # max over pre / post slots of L(t) minus what units hold
    slots: list[str]  # per baseline step: "pre", "fw:k", "mid", "bw:k", "post"
    unit_of_tensor: dict[str, int] = field(default_factory=dict)  # forward tensor -> unit producing it
    notes: list[str] = field(default_factory=list)

    @property
    def total_cost(self) -> float:
        """Seconds of the whole unrewritten step (every node's cost)."""
        return self.costs.total


COVER = 0.5  # a repeated layer's instances are units when they hold this share of their parent's nodes


def _unit_scopes(analysis: ModelAnalysis) -> tuple[list[Scope], dict[int, int]]:
    """The unit scopes, in no particular order, and for repeated ones the id of their layer group.

    From the root down: where a scope's children include instances of a repeated layer that hold
    most of its nodes (GPT's ``blocks.0..3`` in ``blocks``), those instances are units, refined to
    *their* repeated children when those hold most of them (a ResNet stage's basic blocks); other
    children are searched the same way, and a scope holding no repeated layer is a unit itself.
    """
    search = _UnitSearch(analysis)
    search.from_root()
    return search.units, _chains_by_class(search.units, search.chain_of)


class _UnitSearch:
    """The search of :func:`_unit_scopes`: the scope tree's repeated layers and sizes, and the units
    found so far with the layer group of each repeated one (``chain_of``, by scope id)."""

    def __init__(self, analysis: ModelAnalysis):
        tree = analysis.scopes
        self.root = tree.root
        self.group_of: dict[int, int] = {}
        for gi, group in enumerate(tree.repeated_layers()):
            for s in group:
                self.group_of[id(s)] = gi
        self.size = {id(s): len(s.all_nodes()) for s in tree.scopes()}
        self.size[id(tree.root)] = len(tree.root.all_nodes())
        self.pos = analysis.graph.position
        self.units: list[Scope] = []
        self.chain_of: dict[int, int] = {}

    def chained(self, members: list[Scope]) -> bool:
        """Each instance reads the one before it (a stack of layers, not, say, the three Linear
        layers of one MLP with other modules between them)."""
        pos = self.pos
        ordered = sorted(members, key=lambda m: max(pos[id(n)] for n in m.all_nodes()))
        for u, v in itertools.pairwise(ordered):
            produced = {id(t) for n in u.all_nodes() for t in n.outputs}
            if not any(id(t) in produced for n in v.all_nodes() for t in n.inputs):
                return False
        return True

    def main_group(self, scope: Scope) -> list[Scope]:
        """The children of ``scope`` that are chained instances of one repeated layer covering most of it."""
        group_of, size = self.group_of, self.size
        by_group: dict[int, list[Scope]] = {}
        for c in scope.children:
            if id(c) in group_of and size.get(id(c)):
                by_group.setdefault(group_of[id(c)], []).append(c)
        best: list[Scope] = []
        for members in by_group.values():
            total = sum(size[id(c)] for c in members)
            if (
                len(members) > 1
                and total >= COVER * size[id(scope)]
                and total > sum(size[id(c)] for c in best)
                and self.chained(members)
            ):
                best = members
        return best

    def from_root(self) -> None:
        """Search the root's children: its main group refined, the others visited."""
        top = self.main_group(self.root)
        for c in top:
            self.refine(c, self.group_of[id(c)])
        for c in self.root.children:
            if c not in top:
                self.visit(c)

    def refine(self, s: Scope, gi: int) -> None:
        """An instance of repeated layer ``gi``: a unit, or its own main group refined further."""
        inner = self.main_group(s)
        if inner:
            for c in inner:
                self.refine(c, self.group_of[id(c)])
            rest = [c for c in s.children if c not in inner]
            for c in rest:
                self.visit(c)
        else:
            self.units.append(s)
            self.chain_of[id(s)] = gi

    def visit(self, s: Scope) -> None:
        """Any other scope: its main group refined, else its children searched if a repeated layer
        lies below, else a unit (an empty scope is nothing)."""
        if not self.size.get(id(s)):
            return
        members = self.main_group(s)
        if members:
            for c in members:
                self.refine(c, self.group_of[id(c)])
            for c in s.children:
                if c not in members:
                    self.visit(c)
            return
        if any(id(d) in self.group_of for d in s.walk() if d is not s) and s.children:
            for c in s.children:
                self.visit(c)
            return
        self.units.append(s)


def _chains_by_class(units: list[Scope], chain_of: dict[int, int]) -> dict[int, int]:
    """``chain_of`` renumbered, in place, so that a chain is one repeated layer: instances refined
    from different parents (a ResNet's stages) share the class of their layer."""
    by_class: dict[object, int] = {}
    for s in units:
        if id(s) in chain_of:
            key = s.class_name or ("group", chain_of[id(s)])
            chain_of[id(s)] = by_class.setdefault(key, len(by_class))
    return chain_of


def recompute_peak(
    nodes: list[gs.Node], nbytes, keep: set[str], replayable: Callable[[gs.Node], bool] = is_replayable
) -> int:
    """Peak bytes that running clones of ``nodes`` (in order) allocates: tensors in ``keep`` stay
    alive once written, the others until their last reader among ``nodes``. Follows onnxruntime's
    planner where it matters most: an alias (Reshape, ...) allocates nothing, and a kernel that may
    work in place (Softmax, Relu, ...) takes over an input that it reads last. ``nbytes(name)``
    gives a tensor's bytes (0 for one onnxruntime fuses away); ``replayable``: is_replayable, or
    the planner's answers kept per node (:meth:`~onnx_remat.remat.plan.Planner.replayable`)."""
    last: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for t in n.inputs:
            if t.name:
                last[t.name] = i
    buffer: dict[str, int] = {}  # tensor -> buffer id
    size: dict[int, int] = {}
    holders: dict[int, list[str]] = {}
    ids = itertools.count()
    live = peak = 0
    for i, n in enumerate(nodes):
        domain = n.domain or ""
        # a training-mode Dropout is replayed from its mask: its clone writes the output alone
        outputs = n.outputs[:1] if replayable(n) else n.outputs
        for k, t in enumerate(outputs):
            if not t.name:
                continue
            b = nbytes(t.name)
            a = alias_input(domain, n.op, k, len(n.inputs))
            src = n.inputs[a].name if a is not None and n.inputs[a].name in buffer else None
            if src is None:
                for j in inplace_inputs(domain, n.op, k, len(n.inputs)):
                    x = n.inputs[j].name
                    if x in buffer and x not in keep and last.get(x) == i and size[buffer[x]] == b:
                        src = x
                        break
            if src is not None:
                buffer[t.name] = buffer[src]
                holders[buffer[src]].append(t.name)
            else:
                bid = next(ids)
                buffer[t.name] = bid
                size[bid] = b
                holders[bid] = [t.name]
                live += b
        peak = max(peak, live)
        for t in {x.name for x in n.inputs if x.name in buffer} | {x.name for x in n.outputs if x.name in buffer}:
            bid = buffer[t]
            if bid in size and all(h not in keep and last.get(h, -1) <= i for h in holders[bid]):
                live -= size.pop(bid)
    return peak


def holdings(plan, unit_of_tensor: dict[str, int]):
    """``(unit, first step, last step, bytes)`` for every stretch in which a tensor of a unit holds
    a buffer of onnxruntime's planned block (a buffer reused by another tensor, or taken over in
    place, changes holder; it is held until the plan releases it)."""
    steps = len(plan.order)
    holders: dict[str, list[tuple[int, str]]] = {}
    for name, tp in plan.tensors.items():
        if tp.alloc_step is None or tp.kind not in ("allocate", "reuse", "inplace"):
            continue
        owner = plan.tensors.get(tp.buffer)
        if owner is None or not owner.planned or owner.kind != "allocate":
            continue
        holders.setdefault(tp.buffer, []).append((tp.alloc_step, name))
    for buf, hs in holders.items():
        owner = plan.tensors[buf]
        size = align(owner.nbytes or 0)
        end_buf = owner.release_step if owner.release_step is not None else steps - 1
        hs.sort()
        for j, (start, name) in enumerate(hs):
            end = hs[j + 1][0] - 1 if j + 1 < len(hs) else end_buf
            unit = unit_of_tensor.get(name)
            if end >= start and unit is not None:
                yield unit, start, end, size


class UnitHoldings:
    """What each unit's tensors hold of the planned block at a step, asked at the steps wanted.

    ``spans``: per unit, its :func:`holdings` as ``(first step, last step, bytes)``. A unit holds at
    step ``t`` the bytes of its spans with ``first <= t <= last``. Each unit's spans are sorted once
    by both ends, with running sums, so a query is two binary searches: a table of every unit at
    every step would be units x steps (3 GiB for 3,850 layers of 10^5 steps), where the model reads
    each unit at its own slots' steps only, O(steps) in all."""

    def __init__(self, spans: dict[int, list[tuple[int, int, int]]]):
        self._spans: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        for unit, found in spans.items():
            firsts = np.array([f for f, _, _ in found], dtype=np.int64)
            ends = np.array([e + 1 for _, e, _ in found], dtype=np.int64)  # the first step no longer held
            sizes = np.array([b for _, _, b in found], dtype=np.int64)
            by_first, by_end = np.argsort(firsts, kind="stable"), np.argsort(ends, kind="stable")
            self._spans[unit] = (
                firsts[by_first],
                np.concatenate([[0], np.cumsum(sizes[by_first])]),
                ends[by_end],
                np.concatenate([[0], np.cumsum(sizes[by_end])]),
            )

    def at(self, unit: int, steps: np.ndarray | list[int]) -> np.ndarray:
        """Bytes ``unit`` holds at each of ``steps`` (int64, in the order given)."""
        t = np.asarray(steps, dtype=np.int64)
        found = self._spans.get(unit)
        if found is None:
            return np.zeros(len(t), dtype=np.int64)
        firsts, added, ends, dropped = found
        # bytes of the spans begun by t, less those of the spans over before t
        return added[np.searchsorted(firsts, t, side="right")] - dropped[np.searchsorted(ends, t, side="right")]


# The unit scopes in forward order: each scope with its nodes in graph order and its layer group
# (None: not a repeated layer). A function of the analysis alone (ordered_unit_scopes).
OrderedScopes = list[tuple[Scope, list[gs.Node], "int | None"]]


def ordered_unit_scopes(analysis: ModelAnalysis) -> OrderedScopes:
    """The units' scopes (:func:`_unit_scopes`) that hold nodes, in forward order by each one's last
    node (parameter-only nodes may be scheduled early), each with its nodes in graph order and its
    layer group: the units :func:`build_model` makes, read from the analysis alone."""
    scopes, chain_of = _unit_scopes(analysis)
    pos = analysis.graph.position
    built = []
    for s in scopes:
        nodes = sorted(s.all_nodes(), key=lambda n: pos[id(n)])
        if nodes:
            built.append((s, nodes, chain_of.get(id(s))))
    built.sort(key=lambda b: pos[id(b[1][-1])])
    return built


def layer_paths(ordered: OrderedScopes) -> list[str]:
    """The paths of the repeated layers' units, in forward order: what the per-layer reference plan
    recomputes (``[u.path for u in units if u.chain is not None]`` of :func:`build_model`'s units)."""
    return [s.path for s, _, chain in ordered if chain is not None]


class _Builder:
    def __init__(
        self,
        analysis: ModelAnalysis,
        costs: NodeCosts,
        baseline,
        plan,
        rg,
        dropout: str | None,
    ):
        self.a = analysis
        self.tg = analysis.graph
        self.costs = costs
        self.baseline = baseline
        self.mplan = plan
        self.rg = rg
        self.planner = planner_of(analysis, dropout)
        self.notes: list[str] = []
        self.stashed = {t.name for t in self.tg.stashed}

    def rt_bytes(self, name: str) -> int:
        """Bytes of a tensor in onnxruntime's plan of the unrewritten graph: 0 for one its optimizer
        fused away (a Div folded into a MatMul) or that only aliases another's buffer."""
        tp = self.mplan.tensors.get(name)
        if tp is None or tp.kind not in ("allocate", "reuse", "inplace"):
            return 0
        owner = self.mplan.tensors.get(tp.buffer)
        if owner is None or not owner.planned:
            return 0
        return align(tp.nbytes or 0)

    # -- units --------------------------------------------------------------------------------

    def units(self, ordered: OrderedScopes | None = None) -> list[Unit]:
        """The units, from :func:`ordered_unit_scopes` (given, or read now)."""
        built = ordered if ordered is not None else ordered_unit_scopes(self.a)
        owner: dict[int, int] = {}
        for k, (_, nodes, _) in enumerate(built):
            for n in nodes:
                owner[id(n)] = k
        self.owner = owner
        units: list[Unit] = []
        for k, (s, nodes, chain) in enumerate(built):
            stored = [t for n in nodes for t in n.outputs if t.name in self.stashed]
            inside = {id(n) for n in nodes}
            # what later units read: usually stored for the backward pass too (a block's output),
            # but not always (a dynamo export stores the next block's transpose of it instead)
            boundary = [
                t
                for n in nodes
                for t in n.outputs
                if t.name and any(self.tg.is_forward(c) and id(c) not in inside for c in t.outputs)
            ]
            units.append(
                Unit(
                    index=k,
                    scope=s,
                    nodes=nodes,
                    stored=stored,
                    boundary=boundary,
                    stored_bytes=sum(self.rt_bytes(t.name) for t in stored),
                    boundary_bytes=sum(self.rt_bytes(t.name) for t in boundary if t.name in self.stashed),
                    hold_bytes=sum(align(self.a.sizes.nbytes(t.name) or 0) for t in boundary),
                    chain=chain,
                )
            )
        self._chains(units)
        return units

    def _chains(self, units: list[Unit]) -> None:
        """``joins_next``: the next unit is the same repeated layer, reads this one's boundary, and is
        the only forward reader of it; and the boundary can be recomputed."""
        for u, v in itertools.pairwise(units):
            if u.chain is None or u.chain != v.chain or not u.boundary:
                continue
            v_nodes = {id(n) for n in v.nodes}
            ok = True
            for t in u.boundary:
                readers = [c for c in t.outputs if self.tg.is_forward(c)]
                inside_u = {id(n) for n in u.nodes}
                if not all(id(c) in v_nodes or id(c) in inside_u for c in readers) or not any(
                    id(c) in v_nodes for c in readers
                ):
                    ok = False
                p = producer(t)
                if p is None or not self.planner.cloneable(p):
                    ok = False
            u.joins_next = ok

    # -- options ------------------------------------------------------------------------------

    def _accounted(self, segments: list[Segment]) -> list[Segment]:
        notes: list[str] = []
        p = self.planner
        segments = p._merge_overlapping(segments)
        segments = p._settle_shared_boundaries(segments, notes)
        out = []
        for seg in segments:
            p._account(seg)
            if p._skip_reason(seg) is None:
                out.append(seg)
        return out

    def _option(self, unit: Unit, kind: str, segments: list[Segment]) -> Option | None:
        segments = self._accounted(segments)
        if not segments:
            return None
        boundary = {t.name for t in unit.boundary}
        own = {t.name for t in unit.stored}
        released = {t.name for s in segments for t in s.targets if t.name in own and t.name not in boundary}
        if not released:
            return None
        released_bytes = sum(self.rt_bytes(t.name) for t in unit.stored if t.name in released)
        if released_bytes <= 0:
            return None  # what it would release onnxruntime does not keep anyway
        masks = sum(getattr(s, "mask_bytes", 0) for s in segments)
        extra = sum(s.extra_boundary_bytes for s in segments)
        kept = unit.stored_bytes - unit.boundary_bytes - released_bytes + masks + extra
        cost = sum(self.costs.recompute_sum(s.recompute) for s in segments)
        peak = sum(
            recompute_peak(s.recompute, self.rt_bytes, {t.name for t in s.targets}, self.planner.replayable)
            for s in segments
        )
        return Option(kind, segments, cost, max(kept, 0), released_bytes - masks - extra, released_bytes, peak, extra)

    def options(self, unit: Unit) -> None:
        p = self.planner
        store_kept = unit.stored_bytes - unit.boundary_bytes
        unit.options = [Option(STORE, [], 0.0, store_kept, 0)]
        found: list[Option] = []
        cheap = self._cheap_option(unit)
        if cheap is not None:
            found.append(cheap)
        for child in unit.scope.children:
            seg = p.scope_segment(child)
            if seg is not None:
                opt = self._option(unit, f"scope:{child.path}", [seg])
                if opt is not None:
                    found.append(opt)
        seg = p.scope_segment(unit.scope)
        layer = self._option(unit, LAYER, [seg]) if seg is not None else None
        if layer is not None:
            found.append(layer)
        # an option that costs more and releases no more than another is never chosen
        for o in found:
            key = (o.cost, o.kept, o.peak - o.targets)
            if not any(
                q is not o
                and q.cost <= o.cost
                and q.kept <= o.kept
                and q.peak - q.targets <= o.peak - o.targets
                and (q.cost, q.kept, q.peak - q.targets) != key
                for q in found
            ):
                unit.options.append(o)
        full = [n for n in unit.nodes if p.cloneable(n)]
        unit.forward_cost = self.costs.recompute_sum(full)
        unit.advance = recompute_peak(full, self.rt_bytes, {t.name for t in unit.boundary}, self.planner.replayable)

    def _cheap_option(self, unit: Unit) -> Option | None:
        """Op-level recompute of the unit's stored tensors whose clones run no matrix product or
        convolution. Selected nodes' outputs are recomputed, not read, so a selection can pull in an
        expensive producer through another selected node: drop those until none does."""
        p = self.planner
        boundary = {t.name for t in unit.boundary}
        names = [
            n.name
            for n in unit.nodes
            if n.name
            and p.cloneable(n)
            and p._recomputable_outputs(n)
            and not any(t.name in boundary for t in n.outputs)
        ]
        if len(set(names)) != len(names):
            return None  # duplicate node names: op-level selection is by name
        notes: list[str] = []

        def dear(segs: list[Segment]) -> set[str]:
            return {s.label for s in segs if any(m.op in EXPENSIVE_OPS for m in s.recompute)}

        # alone first (a Softmax after a MatMul is dear whatever else is selected), then together
        names = [n for n in names if not dear(p._node_segments([], [n], notes))]
        segs: list[Segment] = []
        for _ in range(len(names) + 1):
            if not names:
                return None
            segs = p._node_segments([], names, notes)
            drop = dear(segs)
            if not drop:
                break
            names = [n for n in names if n not in drop]
        return self._option(unit, CHEAP, segs) if segs else None

    # -- the baseline timeline ----------------------------------------------------------------

    def timeline(self, units: list[Unit]) -> tuple[np.ndarray, UnitHoldings, list[str], np.ndarray]:
        """Per step: live bytes, slot names, and what all units hold; per unit what it holds (own)."""
        plan, rg = self.mplan, self.rg
        steps = len(plan.order)
        live = np.asarray(plan.live_bytes, dtype=np.int64)
        step_of: dict[str, int] = {}
        for k, i in enumerate(plan.order):
            for name in rg.at(i).origin:
                step_of.setdefault(name, k)
        self.step_of = step_of
        # tensor -> unit, by its producer in the training graph
        unit_of_tensor: dict[str, int] = {}
        for u in units:
            for n in u.nodes:
                for t in n.outputs:
                    if t.name:
                        unit_of_tensor[t.name] = u.index
        self.unit_of_tensor = unit_of_tensor
        all_units = np.zeros(steps + 1, dtype=np.int64)
        per_unit: dict[int, list[tuple[int, int, int]]] = {}
        for owner_unit, start, end, size in holdings(plan, unit_of_tensor):
            all_units[start] += size
            all_units[end + 1] -= size
            per_unit.setdefault(owner_unit, []).append((start, end, size))
        held = np.cumsum(all_units)[:steps]
        # slots
        fw_start: list[int | None] = []
        fw_end: list[int | None] = []
        bw_start: list[int | None] = []
        bw_end: list[int | None] = []
        data_nodes = self._data_dependent()
        for u in units:
            fs = [step_of[n.name] for n in u.nodes if n.name in step_of and id(n) in data_nodes]
            fa = [step_of[n.name] for n in u.nodes if n.name in step_of]
            fw_start.append(min(fs) if fs else (min(fa) if fa else None))
            fw_end.append(max(fs) if fs else (max(fa) if fa else None))
            own = [t for t in u.stored if t not in u.boundary] or u.stored
            readers = {c.name for t in own for c in self.tg.backward_consumers(t) if c.name in step_of}
            bs = [step_of[r] for r in readers]
            bw_start.append(min(bs) if bs else None)
            bw_end.append(max(bs) if bs else None)
        regions = [s.region for s in self.baseline.steps]
        known_fw = [(s, k) for k, s in enumerate(fw_start) if s is not None]
        known_fw.sort()
        last_fw = max((e for e in fw_end if e is not None), default=-1)
        known_bw = sorted(((s, k) for k, s in enumerate(bw_start) if s is not None))
        first_bw = known_bw[0][0] if known_bw else steps
        last_bw = max((e for e in bw_end if e is not None), default=-1)
        slots: list[str] = []
        fi = -1
        cur_fw: int | None = None
        first_started_bw: int | None = None  # the least unit whose backward pass has started
        bi = 0
        for t in range(steps):
            while fi + 1 < len(known_fw) and known_fw[fi + 1][0] <= t:
                fi += 1
                cur_fw = known_fw[fi][1]
            while bi < len(known_bw) and known_bw[bi][0] <= t:
                k = known_bw[bi][1]
                first_started_bw = k if first_started_bw is None else min(first_started_bw, k)
                bi += 1
            if regions[t] == "forward" and t < first_bw:
                if cur_fw is None:
                    slots.append("pre")
                elif t > last_fw:
                    slots.append("mid")
                else:
                    slots.append(f"fw:{cur_fw}")
            elif t < first_bw:
                slots.append("mid")
            elif t > last_bw:
                slots.append("post")
            else:
                slots.append(f"bw:{first_started_bw}")
        for u in units:
            fe, be = fw_end[u.index], bw_end[u.index]
            u.fw_steps = (fw_start[u.index] or 0, fe if fe is not None else -1)
            u.bw_steps = (bw_start[u.index] or 0, be if be is not None else -1)
        return live, UnitHoldings(per_unit), slots, held

    def _data_dependent(self) -> set[int]:
        """Forward nodes downstream of a data input (not of parameters alone)."""
        params = {t.name for t in self.tg.parameters}
        inputs = [t for t in self.tg.graph.inputs if t.name not in params]
        seen: set[int] = set()
        stack = [c for t in inputs for c in t.outputs if self.tg.is_forward(c)]
        while stack:
            n = stack.pop()
            if id(n) in seen:
                continue
            seen.add(id(n))
            for o in n.outputs:
                stack.extend(c for c in o.outputs if self.tg.is_forward(c) and id(c) not in seen)
        return seen


def build_model(
    analysis: ModelAnalysis,
    costs: NodeCosts,
    baseline_parts,
    *,
    dropout: str | None = None,
    ordered: OrderedScopes | None = None,
) -> BudgetModel:
    """The :class:`BudgetModel` of ``analysis``. ``baseline_parts`` is
    :func:`onnx_remat.estimate.estimate_graph`'s ``(estimate, plan, runtime graph)`` of the
    unrewritten graph; ``dropout`` is passed to the :class:`Planner` (where it takes one).
    ``ordered``: :func:`ordered_unit_scopes` of ``analysis``, read already by the caller (else read
    here)."""
    est, plan, rg = baseline_parts
    b = _Builder(analysis, costs, est, plan, rg, dropout)
    units = b.units(ordered)
    for u in units:
        b.options(u)
    live, own, slots, held = b.timeline(units)
    ext = live - held
    steps = len(live)
    by_slot: dict[str, list[int]] = {}
    for t, s in enumerate(slots):
        by_slot.setdefault(s, []).append(t)
    for u in units:
        fw = by_slot.get(f"fw:{u.index}", [])
        bw = by_slot.get(f"bw:{u.index}", [])
        if fw:
            idx = np.asarray(fw)
            u.fw_need = int((ext[idx] + own.at(u.index, idx)).max())
        if bw:
            idx = np.asarray(bw)
            u.bw_need = int((ext[idx] + own.at(u.index, idx)).max())
            first = int(idx.min())
        else:
            first = min(u.bw_steps[0], steps - 1)
        u.event_own = int(ext[first] + own.at(u.index, [first])[0])
        u.event_ext = int(ext[first])
    mid = by_slot.get("mid", [])
    # What each unit stores past its forward pass, as onnxruntime runs the graph (its rewrites can
    # keep a tensor the training graph does not, e.g. a transposed input): read where no unit runs.
    ref = min(mid) if mid else max(min((u.bw_steps[0] for u in units), default=0) - 1, 0)
    for u in units:
        if steps == 0:
            break
        held_here = int(own.at(u.index, [ref])[0])
        delta = held_here - u.stored_bytes
        if delta:
            u.stored_bytes = held_here
            for o in u.options:
                o.kept = max(o.kept + delta, 0)
    outside = by_slot.get("pre", []) + by_slot.get("post", [])
    return BudgetModel(
        analysis=analysis,
        costs=costs,
        planner=b.planner,
        units=units,
        baseline_peak=est.planned_peak_bytes,
        baseline_live_peak=est.peak_live_bytes,
        mid_need=int(ext[np.asarray(mid)].max()) if mid else 0,
        outside_need=int(live[np.asarray(outside)].max()) if outside else 0,
        slots=slots,
        unit_of_tensor=b.unit_of_tensor,
        notes=b.notes,
    )
