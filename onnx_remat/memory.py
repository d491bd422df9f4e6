"""The activation memory of one emulated training graph: :class:`MemoryEstimate` and its queries.

The figures of :mod:`onnx_remat.estimate` for one graph, computed from an
:class:`~onnx_remat.ortsim.emulation.Emulation` (what onnxruntime runs, its order and its allocation
plan) and the :class:`~onnx_remat.analysis.ModelAnalysis` of the training graph it is or was
rewritten from (which nodes are forward, backward or recompute; the scope of each stored tensor).
The recompute rewrite, the memory schedule and the budget planner ask these queries of the graphs
they make; :func:`onnx_remat.estimate.estimate` is the user-facing command on top of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import onnx

from onnx_remat.analysis.model import ModelAnalysis
from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.errors import RematError
from onnx_remat.graph import tags
from onnx_remat.graph.conventions import is_gradient_node_name
from onnx_remat.ortsim.emulation import Emulation, emulate
from onnx_remat.ortsim.graph import RuntimeGraph
from onnx_remat.ortsim.planner import MemoryPlan

FORWARD, BACKWARD, RECOMPUTE = "forward", "backward", "recompute"


@dataclass
class Step:
    """One executed node and the memory after its allocations."""

    node: str
    op: str
    region: str  # forward, backward or recompute (clones and barriers)
    live_bytes: int  # planned activations alive
    block_bytes: int  # size of the planned block so far
    outside_bytes: int  # activations of known size allocated outside the block, alive


@dataclass
class LiveTensor:
    tensor: str
    bytes: int
    producer: str
    region: str
    scope: str | None

    def to_json(self) -> dict:
        return {
            "tensor": self.tensor,
            "bytes": self.bytes,
            "producer": self.producer,
            "region": self.region,
            "scope": self.scope,
        }


@dataclass
class MemoryEstimate:
    """The estimated memory of one graph (before or after the rewrite)."""

    planned_peak_bytes: int
    peak_live_bytes: int
    peak_step: int  # the step whose allocation gave the planned block its size
    steps: list[Step]
    live_at_peak: list[LiveTensor]
    outside_block: list[tuple[str, int]]  # (tensor, bytes): sizes onnxruntime learns at run time
    unknown: list[str]  # allocated tensors of unknown size (not counted anywhere)
    order_source: str
    runtime_rewrites: dict[str, int]
    matched_order_nodes: int | None = None  # with a given execution order: nodes matched by name
    order_names: list[str] = field(default_factory=list, repr=False)  # the model's node names, in run order

    def __getstate__(self) -> dict:
        # The steps go as six columns, not an object each: an estimate of a 10^5-node graph comes
        # back from a forked child (remat/pipeline.py's OriginalGraph) as 7.4 MB instead of 9.6,
        # pickled and unpickled in 0.2 s instead of 0.3.
        state = dict(self.__dict__)
        steps = state.pop("steps")
        state["step_columns"] = tuple(
            map(list, zip(*((s.node, s.op, s.region, s.live_bytes, s.block_bytes, s.outside_bytes) for s in steps)))
        )
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        columns = state.pop("step_columns")
        self.__dict__.update(state)
        self.steps = list(map(Step, *columns)) if columns else []

    @property
    def peak_node(self) -> str:
        return self.steps[self.peak_step].node if self.steps else ""

    @property
    def peak_region(self) -> str:
        return self.steps[self.peak_step].region if self.steps else ""

    @property
    def outside_block_bytes(self) -> int:
        return sum(b for _, b in self.outside_block)

    @property
    def live_bytes(self) -> list[int]:
        return [s.live_bytes for s in self.steps]

    @property
    def regions(self) -> list[str]:
        return [s.region for s in self.steps]

    def to_json(self, *, timeline: bool = True, top: int = 20) -> dict:
        data = {
            "planned_peak_bytes": self.planned_peak_bytes,
            "peak_live_bytes": self.peak_live_bytes,
            "peak_step": self.peak_step,
            "peak_node": self.peak_node,
            "peak_region": self.peak_region,
            "executed_nodes": len(self.steps),
            "order": self.order_source,
            "matched_order_nodes": self.matched_order_nodes,
            "runtime_rewrites": dict(self.runtime_rewrites),
            "live_at_peak": [t.to_json() for t in self.live_at_peak[:top]],
            "outside_block": {
                "count": len(self.outside_block),
                "bytes": self.outside_block_bytes,
                "tensors": [{"tensor": n, "bytes": b} for n, b in self.outside_block[:top]],
            },
            "unknown": {"count": len(self.unknown), "tensors": self.unknown[:top]},
        }
        if timeline:
            data["timeline"] = {
                "nodes": [s.node for s in self.steps],
                "region": [s.region for s in self.steps],
                "live_bytes": [s.live_bytes for s in self.steps],
                "block_bytes": [s.block_bytes for s in self.steps],
                "outside_bytes": [s.outside_bytes for s in self.steps],
            }
        return data


# -- the estimate of one graph -------------------------------------------------------------


_REGIONS = (RECOMPUTE, BACKWARD, FORWARD)  # the region of a node standing for several: the first found


def _region_of(names: Sequence[str], regions: dict[str, str]) -> str:
    if len(names) == 1:  # most runtime nodes stand for one model node
        n = names[0]
        one = regions.get(n)
        if one is None and n not in regions:
            return BACKWARD if is_gradient_node_name(n) else FORWARD
        return one if one in _REGIONS else FORWARD
    found = {regions.get(n, BACKWARD if is_gradient_node_name(n) else FORWARD) for n in names}
    for r in _REGIONS:
        if r in found:
            return r
    return FORWARD


def estimate_graph(
    model: onnx.ModelProto,
    sizes: TensorSizes,
    *,
    regions: dict[str, str] | None = None,
    scope_of_tensor: dict[str, str] | None = None,
    execution_order: Sequence[str] | None = None,
    runtime_optimizations: bool = True,
) -> tuple[MemoryEstimate, MemoryPlan, RuntimeGraph]:
    """Estimate one training graph (``sizes``: its tensor sizes; not changed).

    ``regions`` maps node names to forward/backward/recompute (names not listed: by gradient
    naming); ``scope_of_tensor`` names the scope of a tensor's producer for the peak listing;
    ``execution_order`` (node names as onnxruntime ran them) replaces the emulated order.
    Returns the estimate, the allocation plan and the graph onnxruntime runs.
    """
    emu = emulate(model, sizes, optimizations=runtime_optimizations, execution_order=execution_order)
    return memory_estimate(emu, regions=regions, scope_of_tensor=scope_of_tensor), emu.plan, emu.rg


def memory_estimate(
    emu: Emulation, *, regions: dict[str, str] | None = None, scope_of_tensor: dict[str, str] | None = None
) -> MemoryEstimate:
    """The :class:`MemoryEstimate` of an emulated graph (``regions`` and ``scope_of_tensor`` as
    :func:`estimate_graph` takes them): a query on the emulation, which is not run again."""
    regions = regions or {}
    rg, plan, order = emu.rg, emu.plan, emu.order
    node_region = {}
    steps: list[Step] = []
    timelines = zip(order, plan.live_bytes, plan.block_bytes, plan.dynamic_bytes, strict=True)
    for i, live, block, elsewhere in timelines:
        n = rg.at(i)
        region = _region_of(n.origin, regions)
        node_region[n.index] = region
        steps.append(Step(n.name, n.op, region, live, block, elsewhere))
    peak = plan.block_peak_step
    at_peak: list[LiveTensor] = []
    for t in plan.live_at(peak):
        prod = rg.node_of(t.name)
        at_peak.append(
            LiveTensor(
                tensor=t.name,
                bytes=t.nbytes or 0,
                producer=prod.name if prod else "",
                region=node_region.get(prod.index, FORWARD) if prod else FORWARD,
                scope=_scope_lookup(scope_of_tensor or {}, t.name),
            )
        )
    outside = sorted(((n, plan.tensors[n].nbytes or 0) for n in plan.dynamic), key=lambda x: -x[1])
    return MemoryEstimate(
        planned_peak_bytes=plan.planned_peak_bytes,
        peak_live_bytes=plan.peak_live_bytes,
        peak_step=peak,
        steps=steps,
        live_at_peak=at_peak,
        outside_block=outside,
        unknown=list(plan.unknown),
        order_source=emu.order_source,
        runtime_rewrites=dict(rg.rewrites),
        matched_order_nodes=emu.matched_order_nodes,
        order_names=list(emu.names_in_order),
    )


def _scope_lookup(scope_of_tensor: dict[str, str], tensor: str) -> str | None:
    found = scope_of_tensor.get(tensor)
    if found is None and tensor.endswith(tags.CLONE_SUFFIX):
        found = scope_of_tensor.get(tags.original_name(tensor))
    return found


# Every name that makes a node "recompute" or an accumulation contains this (tags' clone suffix,
# barrier, unpack and accumulate prefixes): regions_of skips the tag tests on other names.
_OURS = "remat"
_MARKS = (tags.CLONE_SUFFIX, tags.BARRIER_PREFIX, tags.UNPACK_PREFIX, tags.ACCUMULATE_PREFIX, tags.PARTIAL_GATE_PREFIX)
assert all(_OURS in m for m in _MARKS)


def regions_of(analysis: ModelAnalysis, model: onnx.ModelProto | None = None) -> dict[str, str]:
    """Node name -> forward / backward / recompute, for ``analysis``'s graph or its rewrite ``model``
    (the nodes onnx-remat added, by their names: clones and barriers are "recompute")."""
    out: dict[str, str] = {}
    if model is not None:
        for proto in model.graph.node:
            name = proto.name  # read once: each read of a protobuf field makes a new str
            if _OURS not in name:  # the model's own node (most of them)
                continue
            if tags.is_recompute_name(name):
                out[name] = RECOMPUTE
            elif tags.is_accumulate_name(name) or tags.is_partial_gate_name(name):
                # a partial gradient accumulated in place (scheduling/accumulate.py), or a gate
                # waiting for partials (scheduling/partials.py)
                out[name] = BACKWARD
    own = cast("dict[str, str] | None", analysis.memo.get("regions_of"))
    if own is None:  # the analysed graph's own nodes: walked once per analysis
        tg = analysis.graph
        own = {}
        for n in tg.order:
            if n.name and n.name not in own:  # the first node of a name answers for it
                own[n.name] = BACKWARD if tg.is_backward(n) else FORWARD
        analysis.memo["regions_of"] = own
    for name, region in own.items():
        out.setdefault(name, region)
    return out


def estimate_emulated(analysis: ModelAnalysis, emu: Emulation) -> MemoryEstimate:
    """The estimate of an emulated graph that is ``analysis``'s own or a rewrite of it (clones and
    barriers count as "recompute"): a query on ``emu``, which is not emulated again."""
    return memory_estimate(emu, regions=regions_of(analysis, emu.model), scope_of_tensor=scope_of_tensor(analysis))


def estimate_original(
    analysis: ModelAnalysis, *, execution_order: Sequence[str] | None = None, runtime_optimizations: bool = True
) -> MemoryEstimate:
    """The estimate of the analysed graph itself (see :func:`estimate_graph` for the arguments)."""
    check_dims(analysis)
    if runtime_optimizations and execution_order is None:
        emu = analysis.take_emulation()
    else:
        emu = emulate(
            analysis.model, analysis.sizes, optimizations=runtime_optimizations, execution_order=execution_order
        )
    return estimate_emulated(analysis, emu)


def estimate_rewritten(
    analysis: ModelAnalysis,
    model: onnx.ModelProto,
    *,
    execution_order: Sequence[str] | None = None,
    runtime_optimizations: bool = True,
) -> MemoryEstimate:
    """The estimate of ``model``, a rewrite of the analysed graph (clones count as "recompute")."""
    check_dims(analysis)
    emu = emulate(
        model,
        TensorSizes(model, analysis.sizes.dims),
        optimizations=runtime_optimizations,
        execution_order=execution_order,
    )
    return estimate_emulated(analysis, emu)


def scope_of_tensor(analysis: ModelAnalysis) -> dict[str, str]:
    """Tensor name -> the module path of the forward node that makes it (for the peak listing).
    A new dict; the walk is made once per analysis (``ModelAnalysis.memo``)."""
    kept = cast("dict[str, str] | None", analysis.memo.get("scope_of_tensor"))
    if kept is None:
        kept = {}
        for n in analysis.graph.forward_nodes:
            scope = analysis.scopes.scope_of(n)
            if scope is not None and scope.path:
                for o in n.outputs:
                    if o.name:
                        kept[o.name] = scope.path
        analysis.memo["scope_of_tensor"] = kept
    return dict(kept)


def check_dims(analysis: ModelAnalysis) -> None:
    """Raise a one-line :class:`RematError` naming the symbolic dimensions of the graph inputs
    that ``dims`` leaves unbound (the estimate needs every size)."""
    names = analysis.input_names
    symbols = sorted(analysis.sizes.unbound_symbols(names))
    if symbols:
        example = " ".join(f"--dim {s}=N" for s in symbols)
        raise RematError(
            f"the graph inputs have symbolic dimensions without a value: {', '.join(symbols)}; "
            f"give them, e.g. {example}"
        )


__all__ = [
    "BACKWARD",
    "FORWARD",
    "RECOMPUTE",
    "LiveTensor",
    "MemoryEstimate",
    "Step",
    "check_dims",
    "estimate_emulated",
    "estimate_graph",
    "estimate_original",
    "estimate_rewritten",
    "memory_estimate",
    "regions_of",
    "scope_of_tensor",
]
