"""A model with another node list: the one copy that every order-writing pass makes.

onnxruntime stores no execution order in the file; its DEFAULT order follows the node list
(:mod:`onnx_remat.ortsim.order`), so the passes that order a graph (the memory schedule, random-op
pins) write a new node list and nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx


def with_nodes(model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto]) -> onnx.ModelProto:
    """A copy of ``model`` whose node list is ``nodes`` (``model`` is not changed)."""
    out = onnx.ModelProto()
    graph = model.graph
    # Copy everything but the nodes once, then the nodes in their new order.
    saved = list(graph.node)
    del graph.node[:]
    try:
        out.CopyFrom(model)
    finally:
        graph.node.extend(saved)
    out.graph.node.extend(nodes)
    return out
