"""What onnxruntime 1.19 does to a training graph before it plans memory, emulated.

Input: a :class:`~onnx_remat.ortsim.graph.RuntimeGraph` (:func:`~onnx_remat.ortsim.graph.runtime_graph`
of a training graph and its tensor shapes). Output: the same graph, rewritten as onnxruntime would
before it plans memory: the nodes it executes, each with the *node index* that its execution order
depends on (:mod:`onnx_remat.ortsim.order`). Each rewrite is a unit in :mod:`onnx_remat.ortsim.rewrites`;
this module runs them in onnxruntime's order.

An ``InferenceSession`` (and the training ``Module``) with the default ``ORT_ENABLE_ALL`` level
rewrites the graph on CPU before planning. These rewrites change which tensors exist and the order
the rest runs in, so an estimate that ignored them is off by up to 17% on the example models
(measured: the MindSpore 10-Block network is planned at 215.0 MiB; its unoptimized graph would
need 251.5). Emulated here, in onnxruntime's order, each pass walking the graph in its current
DEFAULT execution order:

* at load: ``Constant`` nodes become initializers;
* level 1, repeated until nothing changes: ``EliminateIdentity``, ``CastElimination``,
  ``NoopElimination``, ``GemmSumFusion`` and ``GemmTransposeFusion`` (rules), ``ConstantSharing``
  (equal constant initializers of up to 8 elements become one), ``CommonSubexpressionElimination``,
  ``ConstantFolding`` (nodes whose inputs are all constant, and ``Shape`` of a statically shaped
  tensor, with the chain of nodes that fed only that Shape), and the ``TransposeOptimizer``
  (Transposes pushed through element-wise, Softmax, Concat/Split, Reduce and (Un)Squeeze ops
  where that removes transposed dimensions, cancelling or merging with other Transposes);
* level 2, repeated until nothing changes: ``GemmTransposeFusion``, ``MatmulTransposeFusion``
  (a Transpose of the last two axes, or of the batch axis, folded into ``FusedMatMul``),
  ``MatMulScaleFusion`` (Mul/Div by a scalar constant before or after a MatMul folded into
  ``FusedMatMul``'s alpha).

New nodes are appended (the next free index) and removed nodes leave holes, as in onnxruntime.
Not emulated (do not change the example graphs; see README for what that means elsewhere):
the TransposeOptimizer's handlers of Shape, Reshape, Slice, Tile, Pad, ArgMax/ArgMin, Resize,
MaxPool and Q/DQ (they count in its cost, nothing is pushed through them), the
remaining level-1 rules (slice/unsqueeze/expand/dropout elimination,
DivMulFusion, ...), ReshapeFusion, GeluFusion, LayerNormFusion, the level-2 fusions of other op
patterns, NCHWc layout (level 3) and every CUDA-only fusion. Every pass is linear (plus a sort
per node's producers); none recurses.
"""

from __future__ import annotations

import onnx

from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.ortsim.graph import RuntimeGraph, node_io, runtime_graph
from onnx_remat.ortsim.rewrites.base import GraphPass, RuleBasedTransformer
from onnx_remat.ortsim.rewrites.constants import ConstantFolding, ConstantSharing
from onnx_remat.ortsim.rewrites.cse import CommonSubexpressionElimination
from onnx_remat.ortsim.rewrites.gemm import GemmSumFusion, GemmTransposeFusion
from onnx_remat.ortsim.rewrites.identity import CastElimination, EliminateIdentity
from onnx_remat.ortsim.rewrites.matmul import MatMulScaleFusion, MatmulTransposeFusion
from onnx_remat.ortsim.rewrites.noop import NoopElimination
from onnx_remat.ortsim.rewrites.transpose import TransposeOptimizer

# onnxruntime's level-1 and level-2 transformers that change which tensors exist, in the order it
# runs them (graph_transformer_utils.cc). Each level repeats until nothing changes.
LEVEL1: list[GraphPass] = [
    RuleBasedTransformer(
        "Level1_RuleBasedTransformer",
        [EliminateIdentity(), CastElimination(), GemmSumFusion(), GemmTransposeFusion(), NoopElimination()],
    ),
    ConstantSharing(),
    CommonSubexpressionElimination(),
    ConstantFolding(),
    TransposeOptimizer(),
]
LEVEL2: list[GraphPass] = [
    RuleBasedTransformer("Level2_RuleBasedTransformer", [GemmTransposeFusion()]),
    MatmulTransposeFusion(),
    MatMulScaleFusion(),
]


def optimize(
    rg: RuntimeGraph, *, max_steps: int = 10, levels: tuple[list[GraphPass], ...] = (LEVEL1, LEVEL2)
) -> RuntimeGraph:
    """Apply the emulated level-1 and level-2 rewrites to ``rg`` in place; returns it.

    A pass whose op types do not occur in the graph is skipped (it would change nothing), and so
    is a pass that changed nothing when the graph has not changed since (it would change nothing
    again: a pass is a function of the graph); each pass that runs walks the graph's current
    DEFAULT order, as onnxruntime's do.
    """
    for passes in levels:
        idle_at: dict[int, int] = {}  # pass position -> rg.edits when it last ran and changed nothing
        for _ in range(max_steps):
            changed = False
            for k, p in enumerate(passes):
                if idle_at.get(k) == rg.edits or not p.applies(rg):
                    continue
                before = rg.edits
                if p.apply(rg):
                    changed = True
                elif rg.edits == before:
                    idle_at[k] = before
            if not changed:
                break
    # What passes kept between their walks (and the edit log they read it by) is of no use once
    # the graph is optimized: freed here rather than held as long as the emulation.
    rg.kept.clear()
    rg.touched.clear()
    return rg


def execution_order(model: onnx.ModelProto, sizes: TensorSizes) -> list[str]:
    """Names of ``model``'s nodes in the order onnxruntime's DEFAULT order would run them (emulated).

    A node fused into another is listed where the fused node runs; nodes removed without a
    replacement are left out. ``sizes`` is not changed.
    """
    from onnx_remat.ortsim.shapes import infer_runtime_shapes

    runtime_sizes = sizes.copy()
    io = node_io(model)
    infer_runtime_shapes(model, runtime_sizes, io=io)
    rg = optimize(runtime_graph(model, runtime_sizes, io=io))
    return [name for i in rg.default_order() for name in rg.at(i).origin]
