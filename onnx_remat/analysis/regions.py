"""Analysis pass: split a training graph into its forward and backward regions.

Input: a :class:`~onnx_remat.graph.bridge.ModelGraph` holding forward and gradient nodes, such as
``training_model.onnx`` from ``onnxruntime.training.artifacts.generate_artifacts``.
Output: a :class:`TrainingGraph`, which says for every node whether it is forward or backward,
which tensor is the loss, which inputs are trainable parameters, and which forward tensors the
backward pass reads (the *stashed activations*: what recompute can release).

How the regions are found (all linear in nodes + edges):

* the loss gradient *seed* is the initializer or input named ``<loss>_grad`` for a produced
  tensor ``<loss>`` (generate_artifacts writes a scalar 1 there); ``<loss>`` is the loss;
* gradient nodes are marked by generate_artifacts (``doc_string`` "Backward pass") and named
  ``<forward node>_Grad/<op>_<k>``, ``AccumulateGrad_<tensor>``, ``GradientAccumulator<k>``;
* the backward region is every marked node and everything downstream of the seed or of a
  marked node; the forward region is the rest (what the loss depends on, and other forward-only
  computation such as normalization statistics).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import onnx
import onnx_graphsurgeon as gs

from onnx_remat.errors import ForwardOnlyGraph, RematError
from onnx_remat.graph.bridge import GraphCopy, ModelGraph, tensor_map
from onnx_remat.graph.conventions import (
    ACCUMULATOR_OPS,
    GRAD_SUFFIX,
    GRADIENT_DOC,
    GRADIENT_SUM_PREFIX,
    buffer_of,
    is_gradient_node_name,
)
from onnx_remat.graph.toposort import stable_toposort


@dataclass
class TrainingGraph:
    """The forward/backward structure of a training graph. Read-only; built by :func:`analyze`.

    ``order`` is a topological order of all nodes (the file's order where that is valid) and
    ``position`` maps ``id(node)`` to its index there. Tensors are keyed by name.
    """

    mg: ModelGraph
    order: list[gs.Node]
    position: dict[int, int]
    backward_ids: set[int]
    loss: gs.Tensor
    seed: gs.Tensor | None
    parameters: list[gs.Variable]
    stashed: list[gs.Tensor]
    tensors: dict[str, gs.Tensor] = field(repr=False)

    @property
    def graph(self) -> gs.Graph:
        return self.mg.graph

    def is_backward(self, node: gs.Node) -> bool:
        return id(node) in self.backward_ids

    def is_forward(self, node: gs.Node) -> bool:
        return id(node) not in self.backward_ids

    @property
    def forward_nodes(self) -> list[gs.Node]:
        """Forward nodes in topological order."""
        return [n for n in self.order if id(n) not in self.backward_ids]

    @property
    def backward_nodes(self) -> list[gs.Node]:
        """Backward nodes in topological order."""
        return [n for n in self.order if id(n) in self.backward_ids]

    def backward_consumers(self, tensor: gs.Tensor) -> list[gs.Node]:
        """Backward nodes that read ``tensor``, in topological order, each once."""
        seen: dict[int, gs.Node] = {}
        for node in tensor.outputs:
            if id(node) in self.backward_ids:
                seen[id(node)] = node
        return sorted(seen.values(), key=lambda n: self.position[id(n)])

    def copy(self) -> tuple[TrainingGraph, GraphCopy]:
        """This analysis on an independent copy of the graph (:meth:`ModelGraph.copy`), and where each
        node and tensor went.

        What :func:`analyze` finds on the copy, carried over node by node instead of found again:
        the copy has the same nodes and edges in the same order, and the analysis depends on nothing
        else (node ids and tensor objects are mapped, positions are the same).
        """
        c = self.mg.copy()
        node, tensor = c.nodes, c.tensors
        order = [node[id(n)] for n in self.order]
        work = TrainingGraph(
            mg=c.mg,
            order=order,
            position={id(n): i for i, n in enumerate(order)},
            backward_ids={id(node[i]) for i in self.backward_ids},
            loss=tensor[id(self.loss)],
            seed=None if self.seed is None else tensor[id(self.seed)],
            parameters=[tensor[id(t)] for t in self.parameters],
            stashed=[tensor[id(t)] for t in self.stashed],
            tensors={name: tensor[id(t)] for name, t in self.tensors.items()},
        )
        return work, c

    def counts(self) -> dict[str, int]:
        """Node and tensor counts by region, for summaries."""
        backward = self.backward_nodes
        return {
            "nodes": len(self.order),
            "forward_nodes": len(self.order) - len(backward),
            "backward_nodes": len(backward),
            "gradient_sums": sum(1 for n in backward if n.name.startswith(GRADIENT_SUM_PREFIX)),
            "gradient_accumulators": sum(1 for n in backward if n.op in ACCUMULATOR_OPS),
            "parameters": len(self.parameters),
            "stashed_activations": len(self.stashed),
        }


def producer(tensor: gs.Tensor) -> gs.Node | None:
    """The node that produces ``tensor``, or None for graph inputs and initializers."""
    return tensor.inputs[0] if tensor.inputs else None


def unique_tensors(tensors) -> list[gs.Tensor]:
    """``tensors`` without repeats (by name), first occurrence kept, order kept."""
    seen: dict[str, gs.Tensor] = {}
    for t in tensors:
        seen.setdefault(t.name, t)
    return list(seen.values())


def analyze(mg: ModelGraph) -> TrainingGraph:
    """Find loss, seed, parameters, forward and backward regions and stashed activations.

    Raises :class:`RematError` for a forward-only graph (no gradient nodes) and for graphs
    whose loss cannot be told apart from their gradients.
    """
    graph = mg.graph
    order = stable_toposort(graph.nodes)
    position = {id(n): i for i, n in enumerate(order)}
    tensors = tensor_map(graph)

    seed, loss = _find_seed_and_loss(graph, tensors)
    marked = [
        n
        for n in order
        if mg.extras(n).doc_string == GRADIENT_DOC or is_gradient_node_name(n.name) or n.op in ACCUMULATOR_OPS
    ]
    if seed is None and not marked:
        raise ForwardOnlyGraph(FORWARD_ONLY)

    backward_ids = {id(n) for n in marked}
    queue: deque[gs.Node] = deque(marked)
    if seed is not None:
        for consumer in seed.outputs:
            if id(consumer) not in backward_ids:
                backward_ids.add(id(consumer))
                queue.append(consumer)
    while queue:
        node = queue.popleft()
        for out in node.outputs:
            for consumer in out.outputs:
                if id(consumer) not in backward_ids:
                    backward_ids.add(id(consumer))
                    queue.append(consumer)

    if loss is None:
        loss = next(
            (o for o in graph.outputs if producer(o) is not None and id(producer(o)) not in backward_ids),
            None,
        )
        if loss is None:
            raise RematError("cannot find the loss: no graph output is computed by forward nodes")
    loss_producer = producer(loss)
    if loss_producer is not None and id(loss_producer) in backward_ids:
        raise RematError(f"the loss {loss.name!r} depends on gradient nodes; is this a training graph?")

    stashed: list[gs.Tensor] = []
    for node in order:
        if id(node) in backward_ids:
            continue
        for out in node.outputs:
            if out.name and any(id(c) in backward_ids for c in out.outputs):
                stashed.append(out)

    input_names = {t.name for t in graph.inputs}
    parameters = [t for t in graph.inputs if t.name + GRAD_SUFFIX in tensors or buffer_of(t.name) in input_names]
    return TrainingGraph(
        mg=mg,
        order=order,
        position=position,
        backward_ids=backward_ids,
        loss=loss,
        seed=seed,
        parameters=parameters,
        stashed=stashed,
        tensors=tensors,
    )


def is_forward_only(model: onnx.ModelProto) -> bool:
    """Whether :func:`analyze` refuses ``model``'s graph as forward-only, read off its NodeProtos
    without importing it: no node the gradient builder made (by doc string, name or op) and no
    ``<loss>_grad`` seed (:func:`_find_seed_and_loss`: a tensor no node makes, named after a graph
    output, or read by a node and named after a tensor a node makes). One pass over the nodes'
    names (0.2 s at 10^5 nodes, where the import takes 2 s)."""
    graph = model.graph
    produced: set[str] = set()
    consumed: set[str] = set()
    for n in graph.node:
        if n.doc_string == GRADIENT_DOC or is_gradient_node_name(n.name) or n.op_type in ACCUMULATOR_OPS:
            return False
        produced.update(n.output)
        consumed.update(n.input)
    initializers = {init.name for init in graph.initializer}  # (graph inputs that are initializers are no tensors here)
    named = consumed | produced | {vi.name for vi in graph.input if vi.name not in initializers}
    named |= {vi.name for vi in graph.output}
    for out in graph.output:
        seed = out.name + GRAD_SUFFIX
        if seed in named and seed not in produced:
            return False
    return not any(
        name.endswith(GRAD_SUFFIX) and name not in produced and name[: -len(GRAD_SUFFIX)] in produced
        for name in consumed
    )


FORWARD_ONLY = (
    "this is a forward-only graph (no gradient nodes): make a training graph first, "
    "e.g. with onnxruntime.training.artifacts.generate_artifacts(model, requires_grad=[...], loss=...)"
)


def _find_seed_and_loss(graph: gs.Graph, tensors: dict[str, gs.Tensor]):
    """The ``<loss>_grad`` seed (an initializer or input) and the loss it belongs to."""
    for out in graph.outputs:
        seed = tensors.get(out.name + GRAD_SUFFIX)
        if seed is not None and producer(seed) is None:
            return seed, out
    for name, tensor in tensors.items():
        if name.endswith(GRAD_SUFFIX) and producer(tensor) is None and tensor.outputs:
            base = tensors.get(name[: -len(GRAD_SUFFIX)])
            if base is not None and producer(base) is not None:
                return tensor, base
    return None, None
