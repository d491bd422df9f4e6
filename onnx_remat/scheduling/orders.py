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
from functools import cached_property
from types import ModuleType

import numpy as np

from onnx_remat import compiled as native
from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.ortsim.graph import RuntimeGraph, RuntimeNode
from onnx_remat.ortsim.kernels import alias_input
from onnx_remat.ortsim.order import compiled_default_order, default_order
from onnx_remat.ortsim.planner import numbered

POLICIES = ("default", "freeing", "greedy")
# The compiled walk's policy codes (onnx_remat/compiled/list_schedule.c).
_POLICY_CODES = {"default": 0, "freeing": 1, "greedy": 2}


def list_schedule(rg: RuntimeGraph, base: Sequence[int], policy: str) -> list[int]:
    """A topological order of ``rg``'s nodes chosen by ``policy`` (one of :data:`POLICIES`).

    ``base``: the current execution order (ties go to the node earlier in it). A node's *delta*
    is the bytes of its outputs that need a new buffer (not an alias of an input) minus the
    bytes of the inputs it is the last reader of (graph inputs and initializers never count);
    it falls as the other readers of its inputs run, and the walk re-ranks the node then.
    To try several policies on one graph, :class:`ListScheduler` reads the graph once.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown scheduling policy {policy!r}")
    return ListScheduler(rg, base).order(policy)


class ListScheduler:
    """:func:`list_schedule` for one graph and ``base`` and any number of policies: what every
    policy reads of the graph (producers, readers, sizes, each node's bytes) is read once.

    The walk is compiled (``onnx_remat/compiled/list_schedule.c``, on the graph as the
    memory planner numbers it: :func:`~onnx_remat.ortsim.planner.numbered`) where the install built
    it and it is not turned off (:func:`~onnx_remat.compiled.compiled`); the Python walk
    here is the reference (tests/scheduling/test_list_schedule_native.py compares both) and walks
    where the compiled one is missing or declines the graph (a tensor written by two nodes)."""

    def __init__(self, rg: RuntimeGraph, base: Sequence[int]):
        self.rg = rg
        self.base = list(base)
        self.position = {i: k for k, i in enumerate(self.base)}
        if len(self.position) != len(self.base):  # a node twice: no order runs every entry of base
            raise RuntimeError("the runtime graph has a cycle")
        self._walk: tuple | None = None  # what the Python walks share, made on first use
        # tensor -> positions of its distinct readers in base, for the tensors whose readers the
        # walks have looked up (every policy asks for the same tensors' readers)
        self._reading_positions: dict[str, list[int]] = {}

    @cached_property
    def nodes(self) -> list[RuntimeNode]:
        """The nodes of base, in its order."""
        return [self.rg.at(i) for i in self.base]

    @cached_property
    def producers(self) -> list[set[int]]:
        """Per position in base, the indices of the nodes feeding it. The Python walk works on
        positions in base: a node's key ends with its position, so positions order the walk exactly
        as node indices with positions as tie-breaks would."""
        return [set(self.rg.producers_of(n)) for n in self.nodes]

    def order(self, policy: str) -> list[int]:
        """The order ``policy`` (one of :data:`POLICIES`) chooses."""
        if policy not in POLICIES:
            raise ValueError(f"unknown scheduling policy {policy!r}")
        walked = self._compiled_order(policy)
        if walked is not None:
            return walked
        base, position = self.base, self.position
        count = len(base)
        if policy == "default" and _runs_in_order(self.producers, position):
            # Always running the earliest ready node of a topological order runs that order.
            return list(base)
        inputs_of, readers0, size, kept, allocates, freed0, dependents, in_degree0 = self._python_walk_state()
        reading = self._reading_positions
        # the walk counts these down: each policy starts from fresh copies
        readers = dict(readers0)
        in_degree = list(in_degree0)
        # freed[k]: bytes of the inputs node k is the last unrun reader of, kept up to date as the
        # other readers run (a delta is then one subtraction, not a walk over the node's inputs).
        freed = list(freed0)

        # Keys are single integers: (rank, position) as rank * count + position, which sorts the same.
        key: Callable[[int], int]
        if policy == "default":
            key = lambda k: k
        elif policy == "freeing":
            key = lambda k: (0 if allocates[k] - freed[k] <= 0 else count) + k
        else:
            key = lambda k: (allocates[k] - freed[k]) * count + k

        ready = [key(k) for k in range(count) if in_degree[k] == 0]
        heapq.heapify(ready)
        done = [False] * count
        order: list[int] = []
        while ready:
            queued = heapq.heappop(ready)
            k = queued % count
            if done[k]:
                continue
            now = key(k)
            if now != queued:  # its inputs lost readers since it was queued
                heapq.heappush(ready, now)
                continue
            done[k] = True
            order.append(base[k])
            for t in inputs_of[k]:
                left = readers[t] = readers[t] - 1
                if left == 1 and policy != "default":
                    readers_of = reading.get(t)
                    if readers_of is None:
                        readers_of = reading[t] = self._reading(t)
                    for c in readers_of:
                        if done[c]:
                            continue
                        if t not in kept:  # c is now the last reader of t
                            freed[c] += size[t]
                        if in_degree[c] == 0:
                            heapq.heappush(ready, key(c))
            for c in dependents[k]:
                in_degree[c] -= 1
                if in_degree[c] == 0:
                    heapq.heappush(ready, key(c))
        if len(order) != count:
            raise RuntimeError("the runtime graph has a cycle")
        return order

    def prepare(self) -> None:
        """Read what the walks read of the graph, once: its numbering for the compiled walk (which
        the memory plans of the graph share), else the Python walks' state. Called before forking the
        processes that walk for several policies, so that they share it."""
        if self._compiled_walk() is not None:
            self._compiled_inputs  # noqa: B018 (the graph numbered: shared with its memory plans)
        else:
            self._python_walk_state()

    def _compiled_walk(self) -> ModuleType | None:
        """The compiled walk (module), None where it is not built or is turned off."""
        return native.compiled(native.list_schedule_walk)

    @cached_property
    def _compiled_inputs(self) -> tuple:
        """What the compiled walk reads: base as int32, and the graph's numbering (made once per
        graph state, shared with its memory plans) with the tensors never freed."""
        arrays = numbered(self.rg)
        kept = arrays.caller | arrays.is_output  # graph inputs, initializers and outputs
        return np.asarray(self.base, dtype=np.int32), arrays, kept

    def _compiled_order(self, policy: str) -> list[int] | None:
        """The compiled walk's order for ``policy``; None where it is missing or declines the graph."""
        walk = self._compiled_walk()
        if walk is None:
            return None
        base, a, kept = self._compiled_inputs
        out = np.empty(len(base), dtype=np.int32)
        code = _POLICY_CODES[policy]
        status = walk.walk(base, code, a.in_ptr, a.in_ids, a.out_ptr, a.out_ids, a.alias, a.size, kept, out)
        if status == 1:
            raise RuntimeError("the runtime graph has a cycle")
        return out.tolist() if status == 0 else None

    def _python_walk_state(self) -> tuple:
        """What every Python walk but the DEFAULT policy's reads (each node's inputs and bytes, the
        readers of each tensor, the dependents of each node), made on the first call: a third of
        a walk's time at 10^5 nodes."""
        if self._walk is None:
            rg = self.rg
            inputs_of, readers0, size, kept = _inputs_read(rg, self.nodes)
            allocates = [_allocated_bytes(n, rg.sizes) for n in self.nodes]
            freed0 = [sum(size[t] for t in ins if readers0[t] == 1 and t not in kept) for ins in inputs_of]
            dependents = _dependents(self.producers, self.position)
            in_degree0 = [len(ps) for ps in self.producers]
            self._walk = (inputs_of, readers0, size, kept, allocates, freed0, dependents, in_degree0)
        return self._walk

    def _reading(self, tensor: str) -> list[int]:
        """Positions in base of the distinct nodes reading ``tensor`` (those outside base left out)."""
        position = self.position
        return [position[i] for i in self.rg.consumer_nodes(tensor) if i in position]


def _inputs_read(
    rg: RuntimeGraph, nodes: Sequence[RuntimeNode]
) -> tuple[list[list[str]], dict[str, int], dict[str, int], set[str]]:
    """Per node its distinct inputs; per tensor its readers among ``nodes`` and its bytes (0 where
    unknown); and the tensors whose buffers no node frees (graph inputs, initializers, outputs)."""
    inputs_of = [list(dict.fromkeys(t for t in n.inputs if t)) for n in nodes]
    readers: dict[str, int] = {}
    for ins in inputs_of:
        for t in ins:
            readers[t] = readers.get(t, 0) + 1
    nbytes = rg.sizes.nbytes
    size = {t: nbytes(t) or 0 for t in readers}
    kept = set(rg.graph_inputs) | set(rg.initializers) | set(rg.graph_outputs)
    return inputs_of, readers, size, kept


def _allocated_bytes(n: RuntimeNode, sizes: TensorSizes) -> int:
    """Bytes of ``n``'s outputs that need a buffer of their own (not an alias of an input)."""
    return sum(
        sizes.nbytes(o) or 0
        for j, o in enumerate(n.outputs)
        if o and alias_input(n.domain, n.op, j, len(n.inputs)) is None
    )


def _dependents(producers: Sequence[set[int]], position: Mapping[int, int]) -> list[list[int]]:
    """Per position, the positions of the nodes reading it (``producers`` by position)."""
    dependents: list[list[int]] = [[] for _ in producers]
    for k, ps in enumerate(producers):
        for p in ps:
            if p in position:  # a producer outside the order never runs: its readers never get ready
                dependents[position[p]].append(k)
    return dependents


def _runs_in_order(producers: Sequence[set[int]], position: Mapping[int, int]) -> bool:
    """Whether every node's producers come before it (``producers`` by position in the order)."""
    for k, ps in enumerate(producers):
        for p in ps:
            at = position.get(p)
            if at is None or at >= k:
                return False
    return True


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
    To rank the leaves of one graph several ways, :class:`LeafOrders` reads the graph once.
    """
    return LeafOrders(rg, first_added).order(rank)


class LeafOrders:
    """:func:`leaf_ranked_order` for one graph and any number of rankings: the graph is read once.
    ``current``: the graph's DEFAULT order as it stands, if known (returned, not walked again, for a
    ranking that leaves the leaves' order as it is).

    The walk runs on the graph's own node indices rather than the indices the moved leaves give:
    moving leaves changes only where each leaf stands. The walk visits producers in index order,
    and a producer is never a leaf; the nodes of the model and those onnxruntime's optimizer
    added keep their relative order too (every added index is above every model node's). So only
    the leaves' order in the list (the walk's starting points) changes with the ranking, and the
    order the walk emits is the one the renumbered list gives, without renumbering every edge.
    """

    def __init__(self, rg: RuntimeGraph, first_added: int, current: Sequence[int] | None = None):
        self.rg = rg
        self.first_added = first_added
        # ``current``: rg's DEFAULT order as its node list stands (an emulation's order, where it is
        # the DEFAULT one): the order of a ranking that keeps the leaves in their list order
        self.current = current
        live = rg.live()
        self.producers: dict[int, list[int]] = {}
        self.has_consumer: set[int] = set()
        self.follow: dict[int, int] = {}
        for n in live:
            ps = rg.producers_of(n)
            if ps:
                self.producers[n.index] = ps
                self.has_consumer.update(ps)
                if n.key in (("", "Shape"), ("", "Size")):
                    self.follow[n.index] = ps[0]
        self.leaves = [n.index for n in live if n.index not in self.has_consumer]  # as leaves(rg)
        leaf_set = set(self.leaves)
        self.before = [n.index for n in live if n.index not in leaf_set and n.index < first_added]
        self.after = [n.index for n in live if n.index not in leaf_set and n.index >= first_added]
        # default_order moves a Shape or Size node after its input's producer, several of one
        # producer in index order: where one of them is a leaf, its renumbered index decides
        self.leaf_follows = not leaf_set.isdisjoint(self.follow)

    def order(self, rank: Mapping[int, int]) -> list[int]:
        """The DEFAULT order with the leaves ranked by ``rank`` (as :func:`leaf_ranked_order`)."""
        if self.leaf_follows:
            return self._renumbered(rank)
        ranked = sorted(self.leaves, key=lambda i: -rank.get(i, -1))  # stable: ties by index
        if self.current is not None and ranked == self.leaves:
            # The leaves keep their order in the list, so the walk is the one it is now (a whole
            # walk saved: the DEFAULT policy ranks them so, as the DEFAULT order runs them).
            return list(self.current)
        # the indices in node-list order (default_order reads its leaves' order from it)
        indices = self.before + ranked + self.after
        compiled = compiled_default_order(indices, self.producers, self.follow)
        if compiled is not None:
            return compiled
        return default_order(indices, self.producers, self.has_consumer, self.follow)

    def _renumbered(self, rank: Mapping[int, int]) -> list[int]:
        """The order by the node list's new indices: every edge renumbered."""
        leaf_set = set(self.leaves)
        first_added = self.first_added

        def key(i: int) -> tuple[int, int]:
            if i in leaf_set:
                return (1, -rank.get(i, -1))
            return (2, i) if i >= first_added else (0, i)

        relabelled = sorted((n.index for n in self.rg.live()), key=key)
        new_of = {old: new for new, old in enumerate(relabelled)}
        producers = {new_of[i]: [new_of[p] for p in ps] for i, ps in self.producers.items()}
        has_consumer = {new_of[i] for i in self.has_consumer}
        follow = {new_of[i]: new_of[p] for i, p in self.follow.items()}
        order = default_order(list(range(len(relabelled))), producers, has_consumer, follow)
        return [relabelled[i] for i in order]
