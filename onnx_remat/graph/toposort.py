"""Iterative, stable topological sort of graphsurgeon nodes.

Replaces ``onnx_graphsurgeon.Graph.toposort()``, which recurses (RecursionError on a few
thousand out-of-order nodes, measured on 0.6.1).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import onnx_graphsurgeon as gs

from onnx_remat.errors import RematError


def stable_toposort(nodes: Sequence[gs.Node]) -> list[gs.Node]:
    """Return ``nodes`` in a topological order, keeping the given order wherever it is valid.

    Stable: among nodes that are ready, the one earliest in ``nodes`` goes first, so a list that
    is already sorted comes back unchanged. Tensors produced outside ``nodes`` (graph inputs,
    initializers) count as available. O((nodes + edges) log nodes), no recursion. Raises
    :class:`RematError` if the nodes contain a cycle.
    """
    producer: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for out in node.outputs:
            if out.name:
                producer[out.name] = i
    waiting_on = [0] * len(nodes)
    dependents: list[list[int]] = [[] for _ in nodes]
    for i, node in enumerate(nodes):
        deps = {producer[t.name] for t in node.inputs if t.name in producer}
        deps.discard(i)
        waiting_on[i] = len(deps)
        for d in deps:
            dependents[d].append(i)
    ready = [i for i, w in enumerate(waiting_on) if w == 0]
    heapq.heapify(ready)
    order: list[gs.Node] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for j in dependents[i]:
            waiting_on[j] -= 1
            if waiting_on[j] == 0:
                heapq.heappush(ready, j)
    if len(order) != len(nodes):
        stuck = next(nodes[i] for i, w in enumerate(waiting_on) if w > 0)
        raise RematError(f"the graph has a cycle (node {stuck.name or stuck.op!r} is on it or after it)")
    return order
