"""Execution orders of the graph onnxruntime runs: proposed by list schedulers, and as a node list
with re-ranked leaves makes onnxruntime's DEFAULT order run it.

Input: a :class:`~onnx_remat.ortsim.graph.RuntimeGraph` (the graph after onnxruntime's rewrites, as
:mod:`onnx_remat.ortsim.optimizer` emulates them) and its current DEFAULT order. Output: orders of its
node indices. Nothing here changes the graph.

* :func:`list_schedule` is a list scheduler in the manner of XLA's memory schedulers: it walks
  the graph, and among the nodes whose inputs exist it runs next the one a policy prefers.
  ``"default"`` keeps the current order; ``"freeing"`` runs a node as soon as it frees at least
  as many bytes as it allocates (a weight gradient and its accumulator right after the gradient
  they read), else the next in the current order; ``"greedy"`` always the node that adds the
  fewest bytes. A policy's order is a *target*: the node list can only suggest it to onnxruntime.
* :func:`leaf_ranked_order` is what onnxruntime's DEFAULT order does with the node list once its
  *leaves* (nodes whose outputs no node reads: the gradient accumulators, the loss) are moved to
  the end of the list in a given rank. The DEFAULT order is a reverse depth-first walk that
  starts from the leaf with the highest node index and runs that leaf's whole upstream cone
  first (:mod:`onnx_remat.ortsim.order`); so the leaf order decides which gradients the backward
  pass computes first, and a leaf placed to run early pulls its weight gradient, and the
  activations that gradient reads, forward in time. :mod:`onnx_remat.scheduling.realize` writes
  that node list.

Every function is iterative and O((nodes + edges) log nodes).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence

from onnx_remat.ortsim.graph import RuntimeGraph
from onnx_remat.ortsim.kernels import alias_input
from onnx_remat.ortsim.order import default_order

POLICIES = ("default", "freeing", "greedy")


def list_schedule(rg: RuntimeGraph, base: Sequence[int], policy: str) -> list[int]:
    """A topological order of ``rg``'s nodes chosen by ``policy`` (one of :data:`POLICIES`).

    ``base``: the current execution order (ties go to the node earlier in it). A node's *delta*
    is the bytes of its outputs that need a new buffer (not an alias of an input) minus the
    bytes of the inputs it is the last reader of (graph inputs and initializers never count);
    it falls as the other readers of its inputs run, and the walk re-ranks the node then.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown scheduling policy {policy!r}")
    position = {i: k for k, i in enumerate(base)}
    nodes = [rg.at(i) for i in base]
    sizes = rg.sizes
    kept = set(rg.graph_inputs) | set(rg.initializers) | set(rg.graph_outputs)
    readers: dict[str, int] = {}
    inputs_of: dict[int, list[str]] = {}
    in_degree: dict[int, int] = {}
    dependents: dict[int, list[int]] = {}
    allocates: dict[int, int] = {}
    for n in nodes:
        ins = list(dict.fromkeys(t for t in n.inputs if t))
        inputs_of[n.index] = ins
        for t in ins:
            readers[t] = readers.get(t, 0) + 1
        producers = set(rg.producers_of(n))
        in_degree[n.index] = len(producers)
        for p in producers:
            dependents.setdefault(p, []).append(n.index)
        allocates[n.index] = sum(
            sizes.nbytes(o) or 0
            for k, o in enumerate(n.outputs)
            if o and alias_input(n.domain, n.op, k, len(n.inputs)) is None
        )

    def delta(i: int) -> int:
        freed = sum(sizes.nbytes(t) or 0 for t in inputs_of[i] if readers[t] == 1 and t not in kept)
        return allocates[i] - freed

    key: Callable[[int], tuple[int, ...]]
    if policy == "default":
        key = lambda i: (position[i],)
    elif policy == "freeing":
        key = lambda i: (0 if delta(i) <= 0 else 1, position[i])
    else:
        key = lambda i: (delta(i), position[i])

    ready = [(key(i), i) for i in position if in_degree[i] == 0]
    heapq.heapify(ready)
    done: set[int] = set()
    order: list[int] = []
    while ready:
        k, i = heapq.heappop(ready)
        if i in done:
            continue
        now = key(i)
        if now != k:  # its inputs lost readers since it was queued
            heapq.heappush(ready, (now, i))
            continue
        done.add(i)
        order.append(i)
        for t in inputs_of[i]:
            readers[t] -= 1
            if readers[t] == 1 and policy != "default":
                for c in rg.consumer_nodes(t):
                    if c not in done and in_degree.get(c) == 0:
                        heapq.heappush(ready, (key(c), c))
        for c in dependents.get(i, ()):
            in_degree[c] -= 1
            if in_degree[c] == 0:
                heapq.heappush(ready, (key(c), c))
    if len(order) != len(nodes):
        raise RuntimeError("the runtime graph has a cycle")
    return order


def leaves(rg: RuntimeGraph) -> list[int]:
    """Indices of the nodes no other node reads from, ascending."""
    read: set[int] = set()
    for n in rg.live():
        read.update(rg.producers_of(n))
    return [n.index for n in rg.live() if n.index not in read]


def leaf_ranked_order(rg: RuntimeGraph, first_added: int, rank: Mapping[int, int]) -> list[int]:
    """onnxruntime's DEFAULT order once the leaves are moved to the end of the node list, the leaf
    of the lowest ``rank`` last (so it gets the highest node index and its cone runs first).

    ``first_added``: the first index onnxruntime gave a node its optimizer made (those stay after
    every node of the model, as onnxruntime appends them when it builds the graph again).
    ``rank`` maps leaf indices to their rank (a leaf without one goes first, i.e. runs last).
    """
    leaf_set = set(leaves(rg))
    live = rg.live()

    def key(i: int) -> tuple[int, int]:
        if i in leaf_set:
            return (1, -rank.get(i, -1))
        return (2, i) if i >= first_added else (0, i)

    relabelled = sorted((n.index for n in live), key=key)
    new_of = {old: new for new, old in enumerate(relabelled)}
    producers: dict[int, list[int]] = {}
    has_consumer: set[int] = set()
    follow: dict[int, int] = {}
    for n in live:
        ps = [new_of[p] for p in rg.producers_of(n)]
        if ps:
            producers[new_of[n.index]] = ps
            has_consumer.update(ps)
            if n.key in (("", "Shape"), ("", "Size")):
                follow[new_of[n.index]] = ps[0]
    order = default_order(list(range(len(relabelled))), producers, has_consumer, follow)
    return [relabelled[i] for i in order]
