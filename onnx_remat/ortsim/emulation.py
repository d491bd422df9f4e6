"""What onnxruntime 1.19 does with one training graph on CPU, in one object.

:func:`emulate` runs the emulation once: the shapes onnxruntime knows
(:mod:`~onnx_remat.ortsim.shapes`), the graph it runs after its rewrites
(:mod:`~onnx_remat.ortsim.optimizer`), its DEFAULT execution order (or an order observed at run
time) and, when first asked for, its allocation plan (:mod:`~onnx_remat.ortsim.planner`). Every
question about that graph (the planned peak, the run order of its nodes, the draw order of its
random ops, the estimate of :mod:`onnx_remat.estimate`) is a query on the :class:`Emulation`, so no
command emulates a graph twice.

:func:`emulate_rewrite` emulates a recompute rewrite with the original's sizes updated, not
inferred again.

:func:`keep_random_order` is the pass that keeps a rewrite's random ops in the original draw order:
it asks the emulation, pins only where the order changed (:mod:`onnx_remat.graph.random_order`),
and emulates the pinned graph.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import onnx

from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.graph.random_order import flipped_pairs, pin_random_order, random_ops
from onnx_remat.ortsim.graph import NodeIO, RuntimeGraph, node_io, runtime_graph
from onnx_remat.ortsim.optimizer import optimize
from onnx_remat.ortsim.order import order_from_names
from onnx_remat.ortsim.planner import MemoryPlan, plan_memory
from onnx_remat.ortsim.shapes import infer_runtime_shapes, rewrite_sizes

DEFAULT_ORDER = "onnxruntime DEFAULT order (emulated)"


@dataclass(eq=False)
class Emulation:
    """One graph as onnxruntime would run it: ``model`` (not changed), ``sizes`` (its tensor sizes
    with the shapes onnxruntime infers), ``rg`` (the graph after onnxruntime's rewrites; node
    indices as onnxruntime gives them, ``first_added`` the first index its optimizer made),
    ``order`` (node indices in execution order), ``plan`` (the allocation plan, computed on
    first use) and ``io`` (:func:`~onnx_remat.ortsim.graph.node_io` of ``model``: not to be
    changed, as no edit of the emulated graph changes it; a graph made of the same nodes reads its
    own from it, :class:`~onnx_remat.scheduling.realize.LeafPlacer`)."""

    model: onnx.ModelProto
    sizes: TensorSizes
    rg: RuntimeGraph
    first_added: int
    order: list[int]
    order_source: str = DEFAULT_ORDER
    matched_order_nodes: int | None = None  # with an order given by name: nodes matched
    io: NodeIO | None = field(default=None, repr=False)
    _plan: MemoryPlan | None = field(default=None, repr=False)
    _peak: int | None = field(default=None, repr=False)  # the plan's peak, planned elsewhere (know_peak)
    # An emulation of ``model`` made from another graph's (:func:`stand_in`): ``rg`` is that graph's,
    # numbered by its node list rather than ``model``'s. Every query reads steps, names and tensors
    # and answers as ``model``'s own emulation would; what reads node indices as node list positions
    # (the memory schedule's predictions) emulates ``model`` afresh.
    stands_in: bool = False
    _names: list[str] | None = field(default=None, repr=False)
    _by_name: dict[str, int] | None = field(default=None, repr=False)
    _random: set[str] | None = field(default=None, repr=False)

    @property
    def plan(self) -> MemoryPlan:
        """onnxruntime's allocation plan and memory pattern for ``order`` (computed once)."""
        if self._plan is None:
            self._plan = plan_memory(self.rg, self.order)
        return self._plan

    @property
    def planned_peak_bytes(self) -> int:
        """The planned peak of ``order``: the plan's (made if not made yet, unless the peak is known:
        :meth:`know_peak`)."""
        if self._plan is None and self._peak is not None:
            return self._peak
        return self.plan.planned_peak_bytes

    @property
    def planned(self) -> bool:
        """Whether the plan has been made (or adopted) already."""
        return self._plan is not None

    def know_peak(self, peak: int) -> None:
        """Take ``peak`` as the planned peak of ``order``, planned in another process (a forked
        child given this emulation): :attr:`planned_peak_bytes` answers from it, and the plan
        itself is made only when asked for. The memory schedule asks only the peak of a graph it
        reorders, unless no order beats it."""
        self._peak = peak

    @property
    def names_in_order(self) -> list[str]:
        """Names of the model's nodes in the order they run (a fused node's parts where it runs;
        nodes removed without a replacement are left out)."""
        if self._names is None:
            self._names = [name for i in self.order for name in self.rg.at(i).origin]
        return self._names

    def adopt_plan(self, rg: RuntimeGraph, order: Sequence[int], plan: MemoryPlan) -> bool:
        """Take ``plan``, made by :func:`~onnx_remat.ortsim.planner.plan_memory` for ``order`` of
        ``rg``, as this emulation's plan when this emulation runs the same thing: the same ops on the
        same tensors with the same attributes, step for step, the same graph inputs and outputs, the
        same initializers and the same tensor sizes (the planner reads nothing else; node indices and
        names may differ). Returns whether it did. The memory schedule predicts each order on one
        emulated graph, then emulates the graph it writes from scratch: where the two agree, the plan
        is not made twice."""
        ours = self.rg
        if (
            self._plan is not None
            or len(order) != len(self.order)
            or ours.sizes is not rg.sizes
            or ours.graph_inputs != rg.graph_inputs
            or ours.graph_outputs != rg.graph_outputs
            or ours.initializers.keys() != rg.initializers.keys()
        ):
            return False
        for i, j in zip(self.order, order):
            a, b = ours.at(i), rg.at(j)
            if (
                a.op != b.op
                or a.domain != b.domain
                or a.inputs != b.inputs
                or a.outputs != b.outputs
                or not a.same_attrs(b)
            ):
                return False
        self._plan = _plan_for(ours, self.order, plan)
        return True

    def runs_as_written(self, name: str, inputs: Sequence[str], readers: Sequence[str]) -> bool:
        """Whether the model's node ``name`` runs as written: a node of that name reading ``inputs``
        whose outputs the nodes named ``readers`` (and no others) read. False for a node
        onnxruntime's rewrites removed, fused or moved (a Transpose pushed past its readers)."""
        if self._by_name is None:
            self._by_name = {n.name: n.index for n in self.rg.live() if n.name}
        index = self._by_name.get(name)
        node = self.rg.nodes[index] if index is not None else None
        if node is None or node.origin != (name,) or list(node.inputs) != list(inputs):
            return False
        read_by = sorted(o for t in node.outputs if t for i in self.rg.consumer_nodes(t) for o in self.rg.at(i).origin)
        return read_by == sorted(readers)

    @property
    def random_names(self) -> set[str]:
        """Names of the model's random ops that draw from the global generator
        (:func:`~onnx_remat.graph.random_order.random_ops`; read once, since every node is read)."""
        if self._random is None:
            self._random = {n.name for n in random_ops(self.model)}
        return self._random

    def random_order(self) -> list[str]:
        """Names of the model's random ops that draw from the global generator, in the order they run."""
        wanted = self.random_names
        return [name for name in self.names_in_order if name in wanted]


def _plan_for(rg: RuntimeGraph, order: Sequence[int], plan: MemoryPlan) -> MemoryPlan:
    """``plan``, made for a graph that runs the same steps as ``order`` of ``rg``, as the plan of
    ``order``: the planner lists tensors as it meets them (graph inputs, initializers in the graph's
    order, which follows the node list where Constant nodes became initializers, then what each step
    writes), and only the initializers' order can differ."""
    tensors = {t: plan.tensors[t] for t in rg.graph_inputs}
    for t in rg.initializers:
        tensors.setdefault(t, plan.tensors[t])
    for t, p in plan.tensors.items():
        tensors.setdefault(t, p)
    return dataclasses.replace(plan, order=list(order), tensors=tensors)


def runs_the_same(emulation: Emulation, rg: RuntimeGraph, order: Sequence[int]) -> bool:
    """Whether ``emulation`` runs what ``order`` of ``rg`` runs, as every query on an emulation reads
    it: step for step the same nodes (names, the model nodes they stand for, ops, tensors and
    attributes), every live node in the order, the same graph inputs, outputs and initializers, the
    same tensor sizes (the same object) and the same rewrites counted. Node indices may differ, and
    the initializers' order (constant folding makes them in the order it walks). Then ``order``'s
    plan is ``emulation``'s (its tensors in ``emulation``'s initializers' order), and an
    :class:`Emulation` of ``rg`` running ``order`` with those initializers answers every query as
    ``emulation`` does (:func:`stand_in`)."""
    ours = emulation.rg
    if (
        len(emulation.order) != len(order)
        or ours.sizes is not rg.sizes
        or ours.graph_inputs != rg.graph_inputs
        or ours.graph_outputs != rg.graph_outputs
        or ours.initializers.keys() != rg.initializers.keys()
        or ours.rewrites != rg.rewrites
        or sum(1 for _ in ours.live()) != len(order)
    ):
        return False
    at_ours, at_theirs = ours.at, rg.at
    for i, j in zip(emulation.order, order):
        a, b = at_ours(i), at_theirs(j)
        if (
            a.name != b.name
            or a.origin != b.origin
            or a.op != b.op
            or a.domain != b.domain
            or a.inputs != b.inputs
            or a.outputs != b.outputs
            or not a.same_attrs(b)
        ):
            return False
    return True


def stand_in(
    emulation: Emulation,
    model: onnx.ModelProto,
    io: NodeIO | None,
    order: Sequence[int],
    plan: MemoryPlan,
    initializers: Sequence[str],
) -> Emulation:
    """The emulation of ``model``, a node list of ``emulation.model`` (``io``: its
    :func:`~onnx_remat.ortsim.graph.node_io`), made of ``emulation``'s graph running ``order``, whose
    plan is ``plan`` (:func:`~onnx_remat.ortsim.planner.plan_memory` of ``order``), rather than
    emulated from scratch: only where ``model`` emulated from scratch :func:`runs_the_same` as
    ``order``, with its initializers in the order ``initializers`` (the caller has checked it: the
    memory schedule, in a forked child, beside its own work). ``emulation`` is not changed; its
    graph's nodes and maps are shared (no query changes them), its initializers put in that order."""
    rg = copy.copy(emulation.rg)  # (shallow: the nodes and maps are the graph's)
    rg.initializers = {name: emulation.rg.initializers[name] for name in initializers}
    adopted = Emulation(model, emulation.sizes, rg, emulation.first_added, list(order), io=io, stands_in=True)
    adopted._plan = _plan_for(rg, order, plan)
    return adopted


def emulate(
    model: onnx.ModelProto,
    sizes: TensorSizes,
    *,
    shapes_known: bool = False,
    optimizations: bool = True,
    execution_order: Sequence[str] | None = None,
    io: NodeIO | None = None,
    protos: Sequence[onnx.NodeProto] | None = None,
) -> Emulation:
    """Emulate onnxruntime on ``model``; ``sizes``: its tensor sizes (symbolic dimensions bound).

    ``sizes`` is not changed: the emulation works on a copy to which it adds the shapes
    onnxruntime infers, unless ``shapes_known`` says ``sizes`` holds them already (a copy of an
    emulation's ``sizes`` for a graph with the same tensors). ``optimizations=False`` emulates the
    graph as written, without onnxruntime's rewrites; ``execution_order`` (node names as
    onnxruntime ran them, e.g. from a profile) replaces the emulated DEFAULT order. ``io``:
    :func:`~onnx_remat.ortsim.graph.node_io` of ``model``, if read already (not changed; kept as
    the emulation's); ``protos``: nodes equal to ``model``'s to read in their place
    (:func:`~onnx_remat.ortsim.graph.runtime_graph`).
    """
    if io is None:
        io = node_io(model)  # the nodes' names, read once for both
    if not shapes_known:
        sizes = sizes.copy()
        infer_runtime_shapes(model, sizes, io=io)
    rg = runtime_graph(model, sizes, io=io, protos=protos)
    first_added = len(rg.nodes)
    if optimizations:
        optimize(rg)
    if execution_order is None:
        return Emulation(model, sizes, rg, first_added, rg.default_order(), io=io)
    live = rg.live()
    order, matched = order_from_names(
        [n.index for n in live],
        {n.index: rg.producers_of(n) for n in live},
        {n.index: n.name for n in live},
        list(execution_order),
    )
    source = f"given order ({matched} of {len(live)} nodes matched by name)"
    return Emulation(model, sizes, rg, first_added, order, source, matched, io=io)


def emulate_rewrite(model: onnx.ModelProto, original_sizes: TensorSizes) -> Emulation:
    """:func:`emulate` on ``model``, a recompute rewrite of a graph whose emulation's sizes are
    ``original_sizes`` (``Emulation.sizes``, with the same dimensions bound): the sizes are updated
    from those rather than inferred again (:func:`~onnx_remat.ortsim.shapes.rewrite_sizes`), which
    is not changed."""
    io = node_io(model)
    return emulate(model, rewrite_sizes(original_sizes, model, io=io), shapes_known=True, io=io)


def keep_random_order(emulation: Emulation, wanted: Sequence[str]) -> tuple[Emulation, list[str]]:
    """The graph of ``emulation`` with its random ops drawing in the ``wanted`` order (node names of
    the original graph's random ops as they ran), and the names of the pins added.

    A graph whose random ops already run in that order comes back as it is, with no pin. Otherwise
    the random ops that now run before their predecessor wait for it (:func:`pin_random_order`,
    only those pairs); where the new order still differs, every consecutive pair is pinned, which
    the data then enforces. Each pinned graph is emulated again (pins are nodes: they change the
    order and can block fusions).
    """
    present = emulation.random_names
    wanted = [name for name in wanted if name in present]
    if len(wanted) < 2:
        return emulation, []
    flipped = flipped_pairs(wanted, emulation.random_order())
    if not flipped:
        return emulation, []
    model, pins = pin_random_order(emulation.model, wanted, pairs=flipped)
    pinned = emulate(model, emulation.sizes)
    if flipped_pairs(wanted, pinned.random_order()):
        model, more = pin_random_order(model, wanted)
        pins += more
        pinned = emulate(model, emulation.sizes)
    if flipped_pairs(wanted, pinned.random_order()):
        raise RuntimeError("random ops still run out of their original order after pinning every pair")
    return pinned, pins
