"""Topological orders, one implementation for the whole package (Kahn's walk, iterative).

* :func:`ready_order`: the walk itself over node indices with a priority among ready nodes
  (onnxruntime's PRIORITY_BASED order and the order-from-a-profile use it);
* :func:`index_order`: a stable order of items given the names they read and write (ties by
  position, so an already sorted list comes back unchanged);
* :func:`stable_toposort`: that, for onnx-graphsurgeon nodes. It replaces
  ``onnx_graphsurgeon.Graph.toposort()``, which recurses (RecursionError on a few thousand
  out-of-order nodes, measured on 0.6.1).

All are O((nodes + edges) log nodes).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

import onnx_graphsurgeon as gs

from onnx_remat.errors import RematError

T = TypeVar("T")


def ready_order(
    indices: Iterable[int],
    dependents: Mapping[int, Sequence[int]],
    in_degree: dict[int, int],
    priority: Callable[[int], float] | None = None,
) -> list[int]:
    """Kahn's walk: among ready nodes the lowest ``(priority(i), i)`` comes first.

    ``dependents[i]``: the nodes reading ``i`` (one entry per edge, matching ``in_degree``, which
    the walk consumes). Nodes on a cycle are left out of the result.
    """
    key = priority or (lambda i: 0)
    ready = [(key(i), i) for i in indices if in_degree[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, node = heapq.heappop(ready)
        order.append(node)
        for c in dependents.get(node, ()):
            in_degree[c] -= 1
            if in_degree[c] == 0:
                heapq.heappush(ready, (key(c), c))
    return order


def index_order(reads: Sequence[Sequence[str]], writes: Sequence[Sequence[str]]) -> list[int]:
    """Positions of items (item ``i`` reads ``reads[i]`` and writes ``writes[i]``) in a stable
    topological order: among ready items the earliest first. Names written by no item (graph
    inputs, initializers) count as available; an item's own outputs do not feed it. An empty name
    is no tensor (an omitted optional input or output)."""
    if already_sorted(reads, writes):
        # the walk would give every position in turn: each is ready once those before it are done
        return list(range(len(reads)))
    producer: dict[str, int] = {}
    for i, outs in enumerate(writes):
        for o in outs:
            if o:
                producer[o] = i
    in_degree: dict[int, int] = {}
    dependents: dict[int, list[int]] = {}
    for i, ins in enumerate(reads):
        deps = {producer[t] for t in ins if t in producer}
        deps.discard(i)
        in_degree[i] = len(deps)
        for d in deps:
            dependents.setdefault(d, []).append(i)
    return ready_order(range(len(reads)), dependents, in_degree)


def already_sorted(reads: Sequence[Sequence[str]], writes: Sequence[Sequence[str]]) -> bool:
    """True when no item reads a name written by a later item, in :func:`index_order`'s terms (a
    name written twice is read from its last writer; an item's own outputs do not feed it), so
    that the order keeps the list as it is. One pass; ONNX asks models to be sorted, and every
    exported graph met is."""
    written: set[str] = set()
    count = 0
    for outs in writes:
        written.update(outs)
        count += len(outs)
    if "" in written:  # omitted optional outputs: not names
        written.discard("")
        count -= sum(1 for outs in writes for o in outs if not o)
    if count != len(written):
        # A name written twice: index_order reads the last writer, so compare each input with
        # its producer's position.
        producer = {o: i for i, outs in enumerate(writes) for o in outs if o}
        return all(producer.get(t, -1) <= i for i, ins in enumerate(reads) for t in ins)
    later = written  # the names written by the item at hand or a later one
    for ins, outs in zip(reads, writes):
        if not later.isdisjoint(ins) and any(t in later and t not in outs for t in ins):
            return False
        later.difference_update(outs)
    return True


def stable_toposort(nodes: Sequence[gs.Node]) -> list[gs.Node]:
    """Return ``nodes`` in a topological order, keeping the given order wherever it is valid.

    Stable: among nodes that are ready, the one earliest in ``nodes`` goes first, so a list that
    is already sorted comes back unchanged. Tensors produced outside ``nodes`` (graph inputs,
    initializers) count as available. Raises :class:`RematError` if the nodes contain a cycle.
    """
    order = index_order([[t.name for t in n.inputs] for n in nodes], [[t.name for t in n.outputs] for n in nodes])
    if len(order) != len(nodes):
        placed = set(order)
        stuck = next(nodes[i] for i in range(len(nodes)) if i not in placed)
        raise RematError(f"the graph has a cycle (node {stuck.name or stuck.op!r} is on it or after it)")
    return [nodes[i] for i in order]
