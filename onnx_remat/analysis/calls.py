"""Analysis pass: the calls of a module instance that the forward pass runs more than once.

A module instance called several times in one forward pass (ALBERT's one shared layer run for every
layer, a recurrent cell run once per time step, a block applied in a loop) leaves one scope in the
exported graph: both exporters name its nodes by the instance's path, the dynamo exporter without
any mark of the call. Recomputed as that one scope, every call is recomputed at once, when the
backward pass reaches the last call, and all their activations are alive together again.
MindSpore's ``Cell.recompute()`` and Paddle's ``recompute`` work per call; so does onnx-remat, once
the calls are told apart here (:func:`onnx_remat.analysis.scopes.resolve_scopes` makes one scope per
call). How much that lowers the peak depends on when each call's weight gradients are made:
onnxruntime makes them at the end of the backward pass, which keeps every call's inputs to them
alive until then, unless the memory schedule makes them early (:mod:`onnx_remat.scheduling.partials`;
ALBERT-base, 12 calls of one layer: 7% lower per call without it, 31% with it).

Input: a scope's forward nodes in topological order and the graph's trainable parameters. Output:
each node's call, or None where the scope was called once or its calls cannot be told apart.

The calls are told apart by the parameters: a call reads each of the instance's parameters once,
so a scope whose parameters are read by at most ``k >= 2`` of its nodes each was called ``k``
times, and the ``j``-th reader of a parameter read ``k`` times (in topological order) belongs to
call ``j``. Each of the instance's own parameters must be read ``k`` times, or, where ``k > 2``,
``k - 1`` times by at most half of them: those have had a read folded away by the exporter (an
LSTM cell's first call, on a hidden state of zeros, reads its hidden weights in a product of
constants). A scope holding a repeated layer and parameters of its own (a model around ALBERT's
shared layer: its embeddings are read once) is not split, its layer is. What nodes compute from parameters
alone counts as a parameter (a weight's transpose that the dynamo exporter's optimizer made once
for every call), and those nodes go with the first call. Frozen parameters and buffers are not
counted (they have no gradient).

Every other node belongs to the latest call among its producers inside the scope (the first call
where it has none): a node that only reshapes a call's input goes with the call before it, whose
output it reads, which keeps each call's output in the call that makes it; but one that reads a
parameter goes with the call that reads its output (the hidden-state product of the next step).
That is a partition in which data only flows from a call to itself or a later one. The split is
not made where a reader of a parameter would come before one of its producers' calls, where a
node reads two parameters as two different calls, or where one call holds more than twice the
nodes of another: calls of one module are alike, and the readers of a parameter need not come in
the order of their calls where no path runs between them (a GRU cell's input products, all made
before the recurrence starts), and then that order is not known.

The split never changes what is computed: a call is a set of nodes to recompute like any scope.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import onnx_graphsurgeon as gs


@dataclass(frozen=True)
class Parameters:
    """The graph's parameters as a call reads them: ``tensors``, the ids of its trainable parameters
    and of what nodes compute from those alone (a weight's transpose, shared by every call where the
    exporter made it once: the dynamo exporter's optimizer does); ``derived``, the ids of those
    nodes, which read parameters without being part of any one call; ``readers``, by parameter id,
    how many other nodes of the forward pass read it."""

    tensors: frozenset[int]
    derived: frozenset[int]
    readers: dict[int, int]
    raw: frozenset[int]  # the trainable parameters themselves

    @classmethod
    def of(cls, parameters: Sequence[gs.Tensor], is_forward: Callable[[gs.Node], bool]) -> Parameters:
        """From the trainable parameters, following their readers in the forward pass (``is_forward``)
        alone: linear in the parameters and what reads them, not in the graph."""
        tensors = {id(t) for t in parameters}
        derived: set[int] = set()
        readers: dict[int, int] = {}
        work = list(parameters)
        while work:
            t = work.pop()
            for n in t.outputs:
                if id(n) in derived or not is_forward(n):
                    continue
                inputs = [x for x in n.inputs if x.name]
                if all(id(x) in tensors or isinstance(x, gs.Constant) for x in inputs):
                    derived.add(id(n))  # (a node read again when another of its inputs turns out derived)
                    for o in n.outputs:
                        tensors.add(id(o))
                        work.append(o)
        for t_id in tensors:
            readers[t_id] = 0
        # counted once the derived nodes are known: a derived node is no reader
        seen: set[int] = set()
        work = list(parameters)
        while work:
            t = work.pop()
            if id(t) in seen:
                continue
            seen.add(id(t))
            for n in {id(n): n for n in t.outputs}.values():
                if not is_forward(n):
                    continue
                if id(n) in derived:
                    work.extend(n.outputs)
                else:
                    readers[id(t)] += 1
        return cls(frozenset(tensors), frozenset(derived), readers, frozenset(id(t) for t in parameters))

    def read_by(self, node: gs.Node) -> set[int]:
        """The ids of the parameters ``node`` reads as part of a call (none for a derived node)."""
        if id(node) in self.derived:
            return set()
        return {id(t) for t in node.inputs if id(t) in self.tensors}

    def read_twice(self) -> bool:
        """Whether some parameter is read by two or more nodes of the forward pass: only then can a
        scope have been called more than once (a cheap test before any scope is split)."""
        return any(count > 1 for count in self.readers.values())


def call_of_nodes(nodes: Sequence[gs.Node], parameters: Parameters) -> list[int] | None:
    """Each of ``nodes``' call (0, 1, ...; the module docstring), in the order given, or None when
    the scope they make up was called once or its calls cannot be told apart. ``nodes``: a scope's
    forward nodes in topological order."""
    index = {id(n): i for i, n in enumerate(nodes)}
    reads = [parameters.read_by(n) for n in nodes]
    readers: dict[int, list[int]] = {}  # parameter id -> the positions of the nodes reading it
    for i, read in enumerate(reads):
        for p in read:
            readers.setdefault(p, []).append(i)
    if not readers:
        return None
    calls = max(len(r) for r in readers.values())
    own = [len(readers[p]) for p in readers if p in parameters.raw]  # the instance's own parameters' reads
    folded = calls - 1 if calls > 2 else calls  # a read folded away in one call (never where 2 calls tell it)
    if calls < 2 or any(k not in (calls, folded) for k in own) or 2 * own.count(calls) < len(own):
        return None  # read once, or not every parameter of it read by each call
    anchor: dict[int, int] = {}  # position -> the call its parameter reads put it in
    for positions in readers.values():
        if len(positions) != calls:
            continue  # a read folded away in some call (a call on a constant input): no anchor
        for call, i in enumerate(positions):
            if anchor.setdefault(i, call) != call:
                return None
    call_of = [0] * len(nodes)
    for i, n in enumerate(nodes):
        latest = 0
        for t in n.inputs:
            if t.inputs:
                j = index.get(id(t.inputs[0]))
                if j is not None and call_of[j] > latest:
                    latest = call_of[j]
        fixed = anchor.get(i)
        if fixed is not None:
            if latest > fixed:
                return None
            latest = fixed
        call_of[i] = latest
    # A node that reads a parameter and is no anchor (its parameter's reads were folded away in some
    # call) goes with the call that reads its output, not with the call before whose output it reads.
    for i in range(len(nodes) - 1, -1, -1):
        if not reads[i] or i in anchor:
            continue
        later = [call_of[j] for t in nodes[i].outputs for c in t.outputs if (j := index.get(id(c))) is not None]
        if later:
            call_of[i] = max(call_of[i], min(later))
    # Calls of one module are alike: where one holds more than twice the nodes of another, the reads
    # were matched to calls in the wrong order (readers with no path between them, such as a GRU's
    # input products, need not come in call order), and the split is not made.
    sizes = [0] * calls
    for c in call_of:
        sizes[c] += 1
    if max(sizes) > 2 * min(sizes):
        return None
    return call_of
