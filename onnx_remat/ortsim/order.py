"""The order in which onnxruntime 1.19 runs a graph's nodes, computed without running it.

Input: nodes identified by their onnxruntime *node index* (the position in the node list when the
model was loaded; nodes the graph optimizer adds get the next free index) and, per node, the
indices of the nodes that produce its inputs. Output: the node indices in execution order.

* :func:`default_order` is ``ExecutionOrder::DEFAULT`` (``GraphViewer`` in
  ``core/graph/graph_viewer.cc`` and ``Graph::ReverseDFSFrom`` in ``core/graph/graph.cc``): the
  leaves (nodes no other node reads from) are pushed on a stack in index order, and a depth-first
  walk from the top of the stack emits each node after all its producers, visiting the producer
  with the *highest* index first. So the last leaf in the node list and its whole upstream cone
  run first; a node inserted right before its first consumer runs just in time, and one appended
  at the end of the list runs as soon as its inputs exist. Then (training builds) every ``Shape``
  and ``Size`` node is moved right after the producer of its input.
* :func:`priority_order` is ``ExecutionOrder::PRIORITY_BASED`` (``KahnsTopologicalSort`` with
  ``PriorityNodeCompare``): ready nodes run lowest index first, ``Shape`` and ``Size`` before all.
* :func:`order_from_names` maps an execution order observed at run time (node names from a
  profile) back onto a graph, placing nodes the profile does not name just before their first
  consumer.

All three are iterative, O((nodes + edges) log nodes). :func:`compiled_default_order` is
:func:`default_order` by the compiled walk (:mod:`~onnx_remat.compiled`), where it is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import chain

import numpy as np

from onnx_remat import compiled as native
from onnx_remat.graph.toposort import ready_order

HIGH_PRIORITY_OPS = frozenset({"Shape", "Size"})


def default_order(
    indices: Sequence[int],
    producers: Mapping[int, Sequence[int]],
    has_consumer: set[int],
    follow_parent: dict[int, int] | None = None,
) -> list[int]:
    """onnxruntime's DEFAULT execution order.

    ``indices``: the live node indices, ascending; ``producers[i]``: indices of the nodes whose
    outputs node ``i`` reads; ``has_consumer``: the nodes some other node reads from;
    ``follow_parent[i] = p``: node ``i`` (a ``Shape`` or ``Size``) runs right after node ``p``,
    the producer of its input. The training build's ``GraphViewer`` moves them there after the
    walk (``ENABLE_TRAINING`` in ``core/graph/graph_viewer.cc``), so that a forward tensor the
    backward pass only measures is freed early; in node-index order when one parent has several.
    """
    size = (max(indices) + 1) if indices else 0
    visited = bytearray(size)
    stack: list[int] = [i for i in indices if i not in has_consumer]  # ~i marks "leave"
    order: list[int] = []
    push, pop, emit, producers_of = stack.append, stack.pop, order.append, producers.get
    while stack:
        node = pop()
        if node < 0:
            emit(~node)
            continue
        if visited[node]:
            continue
        visited[node] = 1
        push(~node)
        ps = producers_of(node)
        if not ps:
            continue
        if len(ps) == 1:  # the common case, without a sort
            if not visited[ps[0]]:
                push(ps[0])
            continue
        for p in sorted(set(ps)):
            if not visited[p]:
                push(p)
    if not follow_parent:
        return order
    followers: dict[int, list[int]] = {}
    for child in sorted(follow_parent):
        followers.setdefault(follow_parent[child], []).append(child)
    moved: list[int] = []
    placed = bytearray(size)
    for node in order:
        if placed[node]:
            continue
        moved.append(node)
        placed[node] = 1
        for child in followers.get(node, ()):
            moved.append(child)
            placed[child] = 1
    return moved


def compiled_default_order(
    indices: Sequence[int], producers: Mapping[int, Sequence[int]], follow_parent: dict[int, int]
) -> list[int] | None:
    """:func:`default_order` by the compiled walk (``compiled/default_order.c``), or None where it is
    not built or turned off. ``indices``: the live nodes in node-list order (as :func:`default_order`
    reads them: ascending, or the leaves moved); ``producers``: the producers of each (none where
    absent); the nodes some node reads from are theirs."""
    walk = native.compiled(native.default_order_walk)
    if walk is None:
        return None
    none: tuple[int, ...] = ()
    lists = [producers.get(i, none) for i in indices]
    ptr = np.zeros(len(lists) + 1, dtype=np.int64)
    ptr[1:] = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    np.cumsum(ptr, out=ptr)
    prods = np.fromiter(chain.from_iterable(lists), dtype=np.int32, count=int(ptr[-1]))
    children = sorted(follow_parent)
    out = np.empty(len(lists), dtype=np.int32)
    written = walk.walk(
        np.array(indices, dtype=np.int32),
        ptr,
        prods,
        np.array(children, dtype=np.int32),
        np.array([follow_parent[c] for c in children], dtype=np.int32),
        out,
    )
    return out[:written].tolist()


def priority_order(indices: Sequence[int], producers: Mapping[int, Sequence[int]], ops: dict[int, str]) -> list[int]:
    """onnxruntime's PRIORITY_BASED execution order (all node priorities 0, all nodes forward)."""
    consumers: dict[int, list[int]] = {i: [] for i in indices}
    in_degree: dict[int, int] = {}
    for i in indices:
        ps = producers.get(i, ())
        in_degree[i] = len(ps)  # one per input edge, as Node::GetInputEdgesCount counts
        for p in ps:
            consumers[p].append(i)
    return ready_order(indices, consumers, in_degree, lambda i: 0 if ops.get(i) in HIGH_PRIORITY_OPS else 1)


def order_from_names(
    indices: Sequence[int],
    producers: Mapping[int, Sequence[int]],
    names: dict[int, str],
    observed: Sequence[str],
) -> tuple[list[int], int]:
    """A topological order that follows ``observed`` (node names in the order they ran).

    Nodes named in ``observed`` keep their relative order where the graph allows it; the others
    run just before their first consumer (or at the end). Returns the order and how many nodes
    were matched by name.
    """
    rank: dict[str, int] = {}
    for pos, name in enumerate(observed):
        rank.setdefault(name, pos)
    consumers: dict[int, list[int]] = {i: [] for i in indices}
    for i in indices:
        for p in set(producers.get(i, ())):
            consumers[p].append(i)
    # Key of a node: its observed position, or (for unmatched nodes) just below the smallest key
    # among its consumers: computed consumers-first over a reverse topological walk.
    topo = priority_order(indices, producers, {})
    big = float(len(observed) + len(indices) + 1)
    key: dict[int, float] = {}
    matched = 0
    for node in reversed(topo):
        if names.get(node) in rank:
            key[node] = float(rank[names[node]])
            matched += 1
        else:
            below = [key[c] for c in consumers[node]]
            key[node] = (min(below) - 0.5) if below else big
    in_degree = {i: len(set(producers.get(i, ()))) for i in indices}
    return ready_order(indices, consumers, in_degree, key.__getitem__), matched
