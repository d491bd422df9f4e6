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

from collections.abc import Mapping

import onnx

from onnx_remat.graph.node_list import with_nodes


def model_leaves(model: onnx.ModelProto) -> list[int]:
    """Positions of the nodes none of whose outputs another node reads."""
    nodes = model.graph.node
    read: set[str] = set()
    for node in nodes:
        read.update(node.input)
    read.discard("")  # an omitted optional input or output is no tensor
    return [k for k, node in enumerate(nodes) if read.isdisjoint(node.output)]


class LeafPlacer:
    """:func:`place_leaves` for one model and several rankings: the model's nodes and leaves are
    read once, and each ranking's node list is known (:meth:`positions`) before any copy is made
    (:meth:`write`), so a caller can skip a list it has already written."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.nodes = list(model.graph.node)
        self.names = [n.name for n in self.nodes]
        self.movable = [k for k in model_leaves(model) if self.names[k]]
        moving = set(self.movable)
        self.rest = [k for k in range(len(self.nodes)) if k not in moving]

    def positions(self, rank: Mapping[str, float]) -> list[int]:
        """The new node list as positions in the model's (see :func:`place_leaves`)."""
        names = self.names
        unranked = float("inf")
        tail = sorted(self.movable, key=lambda k: (-rank.get(names[k], unranked), k))
        return self.rest + tail

    def write(self, positions: list[int]) -> onnx.ModelProto:
        """A copy of the model with the node list ``positions``."""
        nodes = self.nodes
        return with_nodes(self.model, [nodes[k] for k in positions])


def place_leaves(model: onnx.ModelProto, rank: Mapping[str, float]) -> onnx.ModelProto:
    """``model`` with its leaves moved to the end of the node list, highest ``rank`` first.

    ``rank`` maps leaf node names to when their cone should run (lower: earlier); the lowest
    rank ends up last in the list, where onnxruntime's DEFAULT order starts. Leaves without a
    rank go first (their cones run last), in their current order. Unnamed leaves keep their place.
    """
    placer = LeafPlacer(model)
    return placer.write(placer.positions(rank))
