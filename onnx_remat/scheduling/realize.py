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


def place_leaves(model: onnx.ModelProto, rank: Mapping[str, float]) -> onnx.ModelProto:
    """``model`` with its leaves moved to the end of the node list, highest ``rank`` first.

    ``rank`` maps leaf node names to when their cone should run (lower: earlier); the lowest
    rank ends up last in the list, where onnxruntime's DEFAULT order starts. Leaves without a
    rank go first (their cones run last), in their current order. Unnamed leaves keep their place.
    """
    nodes = list(model.graph.node)
    movable = [k for k in model_leaves(model) if nodes[k].name]
    moving = set(movable)
    unranked = float("inf")
    tail = sorted(movable, key=lambda k: (-rank.get(nodes[k].name, unranked), k))
    rest = [n for k, n in enumerate(nodes) if k not in moving]
    return with_nodes(model, rest + [nodes[k] for k in tail])
