"""Write an execution order into a model's node list, which is all onnxruntime's DEFAULT order reads.

Input: an ``onnx.ModelProto`` and ranks for its leaves; output: a new ModelProto (the input is not
changed) whose node list onnxruntime turns into the wanted order.

onnxruntime 1.19 stores no order in the file: its DEFAULT order is a reverse depth-first walk from
the graph's leaves (nodes no other node reads from), highest node index first
(:mod:`onnx_remat.ortsim.order`). Leaves can go anywhere after their producers, so moving them to
the end of the node list, in the order their cones should run (the first one last), changes the
order of the backward pass without touching anything else: :func:`place_leaves`. The rest of the
list keeps its relative order, so each leaf's cone runs as it did before.

Forward random ops (``Dropout``, ...) draw from one global generator: where a new order changes
their order, :mod:`onnx_remat.graph.random_order` pins them to the original one.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from itertools import chain

import onnx

from onnx_remat.graph.conventions import SUBGRAPH_ATTRIBUTES
from onnx_remat.graph.node_list import with_nodes
from onnx_remat.ortsim.graph import NodeIO, node_io


def model_leaves(model: onnx.ModelProto, io: NodeIO | None = None) -> list[int]:
    """Positions of the nodes none of whose outputs another node reads. ``io``:
    :func:`~onnx_remat.ortsim.graph.node_io` of ``model``, if read already (reading the names
    from the model's nodes again costs several times more)."""
    inputs, outputs = io if io is not None else node_io(model)
    read = set(chain.from_iterable(inputs))
    read.discard("")  # an omitted optional input or output is no tensor
    return [k for k, outs in enumerate(outputs) if read.isdisjoint(outs)]


class LeafPlacer:
    """:func:`place_leaves` for one model and several rankings: the model's nodes and leaves are
    read once, and each ranking's node list is known (:meth:`positions`) before any copy is made
    (:meth:`write`), so a caller can skip a list it has already written. ``io``:
    :func:`~onnx_remat.ortsim.graph.node_io` of ``model`` (an emulation's ``io``), if read already:
    then each written model's is known too (:meth:`io`)."""

    def __init__(self, model: onnx.ModelProto, io: NodeIO | None = None):
        self.model = model
        self.nodes = list(model.graph.node)
        self.names = [n.name for n in self.nodes]
        self._io = io
        self.movable = [k for k in model_leaves(model, io) if self.names[k]]
        moving = set(self.movable)
        self.rest = [k for k in range(len(self.nodes)) if k not in moving]

    @functools.cached_property
    def sorted_as_given(self) -> bool:
        """Whether every node list :meth:`write` writes is, like the model's own, topologically
        sorted, so that a model written differs from the model only in the order of its nodes:
        onnxruntime's verdict on the model is then the written one's
        (:meth:`~onnx_remat.scheduling.schedule.MemorySchedule.__call__`'s ``model_check``). A
        moved leaf's outputs are read by no node, except where a subgraph reads them from the
        outer scope, which :func:`~onnx_remat.ortsim.graph.node_io` does not list: a model with
        subgraphs is not taken to stay sorted."""
        return not any(a.type in SUBGRAPH_ATTRIBUTES for n in self.nodes if n.attribute for a in n.attribute)

    def positions(self, rank: Mapping[str, float]) -> list[int]:
        """The new node list as positions in the model's (see :func:`place_leaves`)."""
        names = self.names
        unranked = float("inf")
        tail = sorted(self.movable, key=lambda k: (-rank.get(names[k], unranked), k))
        return self.rest + tail

    def write(self, positions: list[int]) -> onnx.ModelProto:
        """A copy of the model with the node list ``positions``."""
        return with_nodes(self.model, self.protos(positions))

    def protos(self, positions: list[int]) -> list[onnx.NodeProto]:
        """The model's nodes in the order of ``positions``: equal to those :meth:`write` writes,
        which an emulation of the written model may read in their place
        (:func:`~onnx_remat.ortsim.emulation.emulate`'s ``protos``)."""
        nodes = self.nodes
        return [nodes[k] for k in positions]

    def io(self, positions: list[int]) -> NodeIO | None:
        """:func:`~onnx_remat.ortsim.graph.node_io` of :meth:`write`'s model for ``positions``,
        from the model's (None where it was not given): the same lists, not to be changed."""
        if self._io is None:
            return None
        inputs, outputs = self._io
        return [inputs[k] for k in positions], [outputs[k] for k in positions]


def place_leaves(model: onnx.ModelProto, rank: Mapping[str, float]) -> onnx.ModelProto:
    """``model`` with its leaves moved to the end of the node list, highest ``rank`` first.

    ``rank`` maps leaf node names to when their cone should run (lower: earlier); the lowest
    rank ends up last in the list, where onnxruntime's DEFAULT order starts. Leaves without a
    rank go first (their cones run last), in their current order. Unnamed leaves keep their place.
    """
    placer = LeafPlacer(model)
    return placer.write(placer.positions(rank))
