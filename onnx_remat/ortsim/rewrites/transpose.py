"""onnxruntime's ``TransposeOptimizer`` (level 1): Transposes pushed through element-wise, Softmax,
Concat/Split, Reduce and (Un)Squeeze ops where that removes transposed dimensions, cancelling or
merging with other Transposes. Its handlers of Shape, Reshape, Slice, Tile, Pad, ArgMax/ArgMin,
Resize, MaxPool and Q/DQ are not emulated: they count in its cost, nothing is pushed through them."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_remat.ortsim.graph import RuntimeGraph, RuntimeNode, constant_value
from onnx_remat.ortsim.rewrites.base import GraphPass

# onnxruntime's level-1 TransposeOptimizer (core/optimizer/transpose_optimization/
# onnx_transpose_optimization.cc, OptimizeImpl), emulated for the ONNX ops training graphs meet.
# It walks the nodes once in DEFAULT order; at each node reading a Transpose it estimates the
# cost of pushing that Transpose through the node (transposed dimensions before minus after,
# "rank" = number of dimensions != 1, 5 when unknown; an output leading through supported ops to
# another Transpose costs nothing) and pushes it when the cost strictly falls: the node's inputs
# get the inverse permutation (cancelling Transposes, composing them, transposing constants in
# place, or adding new Transpose / Unsqueeze nodes) and its outputs a new Transpose each. New
# nodes are appended (the next free index), as onnxruntime's AddNode does. Handled: element-wise
# unary and broadcasting ops, Transpose, Softmax / LogSoftmax / Hardmax, Concat, Split, the Reduce
# ops, Squeeze, Unsqueeze; the other ops onnxruntime has a handler for (Shape, Reshape, Slice,
# Tile, Pad, ArgMax / ArgMin, Resize, MaxPool, Q/DQ) count as handled in the cost but are never
# pushed through (a simplification: they rarely follow a Transpose in training graphs).
# Contrib and gradient ops (com.microsoft) have no handler: Transposes stop there.

_TP_SIMPLE = frozenset(
    {
        "Cast",
        "Exp",
        "Gelu",
        "Identity",
        "LeakyRelu",
        "Log",
        "Reciprocal",
        "Relu",
        "Sigmoid",
        "Sqrt",
        "Tanh",
        "Abs",
        "Not",
        "Ceil",
        "Floor",
        "Neg",
        "Erf",
        "HardSigmoid",
        "Round",
        "IsInf",
        "IsNaN",
        "Selu",
        "Shrink",
        "Sign",
        "Softplus",
        "Softsign",
        "ThresholdedRelu",
        "Celu",
        "HardSwish",
        "Sin",
        "Cos",
        "Tan",
        "Sinh",
        "Cosh",
        "Asin",
        "Acos",
        "Atan",
        "Asinh",
        "Acosh",
        "Atanh",
    }
)
_TP_BROADCAST = frozenset(
    {
        "Add",
        "Max",
        "Min",
        "Mul",
        "Sub",
        "Div",
        "And",
        "Or",
        "Xor",
        "Mod",
        "PRelu",
        "BitShift",
        "Equal",
        "Greater",
        "Less",
        "GreaterOrEqual",
        "LessOrEqual",
        "Mean",
        "Sum",
        "Pow",
        "Where",
    }
)
_TP_REDUCE = frozenset(
    {
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceMax",
        "ReduceMean",
        "ReduceMin",
        "ReduceProd",
        "ReduceSum",
        "ReduceSumSquare",
        "ReduceL1",
        "ReduceL2",
    }
)
_TP_KIND = {op: "simple" for op in _TP_SIMPLE}
_TP_KIND.update({op: "broadcast" for op in _TP_BROADCAST})
_TP_KIND.update({op: "reduce" for op in _TP_REDUCE})
_TP_KIND.update(
    {
        "Clip": "first",
        "CastLike": "first",
        "Transpose": "transpose",
        "Concat": "concat",
        "Split": "split",
        "Softmax": "softmax",
        "Hardmax": "softmax",
        "LogSoftmax": "softmax",
        "Squeeze": "squeeze",
        "Unsqueeze": "unsqueeze",
    }
)
# onnxruntime has handlers for these too; the emulation never pushes through them. Shape's and
# Reshape's handlers do not transpose outputs, the others do.
_TP_KIND.update(
    {
        op: "inert"
        for op in (
            "Pad",
            "Slice",
            "Tile",
            "ArgMin",
            "ArgMax",
            "Resize",
            "MaxPool",
            "QuantizeLinear",
            "DequantizeLinear",
        )
    }
)
_TP_KIND.update({"Shape": "inert_no_output", "Reshape": "inert_no_output"})
_TP_NO_OUTPUT_TRANSPOSE = frozenset({"transpose", "inert_no_output"})
_TP_INERT = frozenset({"inert", "inert_no_output"})

PUSHED_THROUGH: frozenset[str] = frozenset(op for op, kind in _TP_KIND.items() if kind not in _TP_INERT)
"""The ONNX-domain ops onnxruntime's TransposeOptimizer pushes a Transpose through (a Transpose
among them: the two cancel or merge); contrib ops stop it."""


def _invert_perm(perm: list[int]) -> list[int]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def _compose_perm(perm1: list[int], perm2: list[int]) -> list[int]:
    return [perm1[p] for p in perm2]


def _valid_perm(perm) -> list[int] | None:
    if perm is None:
        return None
    perm = [int(p) for p in perm]
    return perm if sorted(perm) == list(range(len(perm))) else None


def _unsqueeze_perm(axes: list[int], perm: list[int]) -> list[int]:
    new_rank = len(perm) + len(axes)
    added = [False] * new_rank
    for a in axes:
        added[a] = True
    axes_map = [i for i in range(new_rank) if not added[i]]
    out, j = [], 0
    for i in range(new_rank):
        if added[i]:
            out.append(i)
        else:
            out.append(axes_map[perm[j]])
            j += 1
    return out


def _squeeze_perm(axes: list[int], perm: list[int]) -> list[int]:
    removed = [False] * len(perm)
    for a in axes:
        removed[a] = True
    axes_map, j = [0] * len(perm), 0
    for i in range(len(perm)):
        if not removed[i]:
            axes_map[i] = j
            j += 1
    return [axes_map[p] for p in perm if not removed[p]]


def _normalize_axes(axes: list[int], rank: int) -> list[int] | None:
    out = [a + rank if a < 0 else a for a in axes]
    if any(a < 0 or a >= rank for a in out) or len(set(out)) != len(out):
        return None
    return out


class _Pusher:
    def __init__(self, rg: RuntimeGraph, opset: int) -> None:
        self.rg = rg
        self.opset = opset
        self.token = 0
        self.changed = False

    # -- graph queries ------------------------------------------------------------------------

    def kind(self, node: RuntimeNode) -> str | None:
        return _TP_KIND.get(node.op) if node.domain == "" else None

    def shape(self, t: str) -> tuple | None:
        sizes = self.rg.sizes
        if not t:
            return None
        if sizes.declared(t):
            return sizes.raw_dims(t)
        init = self.rg.initializers.get(t)
        return tuple(init.dims) if init is not None else None

    def rank_cost(self, t: str) -> int:
        dims = self.shape(t)
        return 5 if dims is None else sum(1 for d in dims if d != 1)

    def set_shape(self, name: str, like: str, dims) -> None:
        elem = self.rg.sizes.elem_type(like) or onnx.TensorProto.FLOAT
        vi = helper.make_tensor_value_info(name, elem, [d if isinstance(d, (int, str)) else None for d in dims])
        self.rg.sizes._add_value_infos([vi], overwrite=True)

    def is_constant(self, t: str) -> bool:
        return bool(t) and self.rg.node_of(t) is None and self.rg.is_constant(t)

    def readers(self, t: str) -> list[RuntimeNode]:
        return [n for n in (self.rg.nodes[i] for i in self.rg.consumer_nodes(t)) if n is not None]

    def comprehensive(self, t: str) -> bool:
        return t not in self.rg.graph_output_set

    def transposible(self, node: RuntimeNode, kind: str) -> list[int]:
        if kind in ("simple", "concat"):
            return list(range(len(node.inputs)))
        if kind == "broadcast":
            return [i for i, t in enumerate(node.inputs) if (shape := self.shape(t)) is None or len(shape) != 0]
        return [0]

    def new_name(self, base: str) -> str:
        self.token += 1
        return f"TransposeOptimizer/{base}_token_{self.token}"

    # -- edits --------------------------------------------------------------------------------

    def make_transpose(self, inp: str, perm: list[int]) -> RuntimeNode:
        name = self.new_name("Transpose")
        return self.rg.add(name, "Transpose", "", [inp], [name + "_out0"], {"perm": list(perm)}, ())

    def add_int64_initializer(self, values: list[int]) -> str:
        name = self.new_name("const_transpose_optimizer")
        arr = np.array(values, dtype=np.int64)
        self.rg.initializers[name] = numpy_helper.from_array(arr, name)
        self.rg.constants.add(name)
        self.rg._values[name] = arr
        self.set_shape(name, name, arr.shape)
        self.rg.sizes._add_value_infos(
            [helper.make_tensor_value_info(name, onnx.TensorProto.INT64, list(arr.shape))], overwrite=True
        )
        return name

    def set_input(self, node: RuntimeNode, k: int, new: str) -> None:
        old = node.inputs[k]
        if old == new:
            return
        rg = self.rg
        rg.edits += 1
        rg.touch(node)
        rg._prods.pop(node.index, None)
        node.inputs = node.inputs[:]  # a new list: see RuntimeNode.inputs
        node.inputs[k] = new
        lst = rg.consumers.get(old)
        if lst and node.index in lst:
            lst.remove(node.index)
        if new:
            rg.consumers.setdefault(new, []).append(node.index)

    def remove(self, node: RuntimeNode) -> None:
        if self.rg.nodes[node.index] is not None:
            self.rg.remove(node)

    def move_output(self, src: RuntimeNode, k: int, dst: RuntimeNode, j: int) -> None:
        """onnxruntime's MoveOutput: ``dst`` takes over output ``k`` of ``src`` (its name and readers);
        ``src`` gets a new output name."""
        rg = self.rg
        rg.edits += 1
        name = src.outputs[k]
        new = self.new_name(name.rsplit("/", 1)[-1] or "out")
        src.outputs, dst.outputs = src.outputs[:], dst.outputs[:]  # new lists: see RuntimeNode.inputs
        src.outputs[k] = new
        dst.outputs[j] = name
        rg.touch(src)
        rg.touch(dst)
        rg._touch_readers([name])
        rg.producer[name] = dst.index
        rg.producer[new] = src.index

    def transpose_input(self, node: RuntimeNode, i: int, perm: list[int], perm_inv: list[int]) -> None:
        rg = self.rg
        inp = node.inputs[i]
        self.set_input(node, i, "")
        if self.is_constant(inp):
            # Case 1: a constant is transposed in place; its other readers get a Transpose back.
            self.set_input(node, i, inp)
            init = rg.initializers.get(inp)
            n_elem = int(np.prod(init.dims)) if init is not None else 0
            dims = self.shape(inp)
            if n_elem == 1 or dims is None or (len(dims) == 1 and dims[0] == len(perm)):
                return
            others = [r for r in self.readers(inp) if r.index != node.index]
            if others:
                t = self.make_transpose(inp, perm_inv)
                self.set_shape(t.outputs[0], inp, dims)
                for r in others:
                    for k, x in enumerate(r.inputs):
                        if x == inp:
                            self.set_input(r, k, t.outputs[0])
            if len(dims) == len(perm):
                self.set_shape(inp, inp, [dims[p] for p in perm])
            return
        producer = rg.node_of(inp)
        if producer is not None and producer.key == ("", "Transpose"):
            perm2 = _valid_perm(producer.attrs.get("perm"))
            if perm2 is not None and len(perm2) == len(perm):
                pre = producer.inputs[0]
                if perm2 == perm_inv:  # Case 2: they cancel
                    self.set_input(node, i, pre)
                    if not rg.consumers.get(inp) and self.comprehensive(inp):
                        self.remove(producer)
                    return
                t = self.make_transpose(pre, _compose_perm(perm2, perm))
                dims = self.shape(inp)
                if dims is not None:
                    self.set_shape(t.outputs[0], inp, [dims[p] for p in perm])
                if not rg.consumers.get(inp) and self.comprehensive(inp):
                    self.remove(producer)
                self.set_input(node, i, t.outputs[0])
                return
        for r in self.readers(inp):  # Case 3: the same Transpose exists already
            if r.key == ("", "Transpose") and _valid_perm(r.attrs.get("perm")) == perm:
                self.set_input(node, i, r.outputs[0])
                return
        t = self.make_transpose(inp, perm)  # Case 4: a new Transpose
        dims = self.shape(inp)
        if dims is not None and len(dims) == len(perm):
            self.set_shape(t.outputs[0], inp, [dims[p] for p in perm])
        self.set_input(node, i, t.outputs[0])

    def transpose_output(self, node: RuntimeNode, k: int, perm: list[int], perm_inv: list[int]) -> str:
        t = self.rg.add(self.new_name("Transpose"), "Transpose", "", [""], [""], {"perm": list(perm)}, ())
        old = node.outputs[k]
        dims = self.shape(old)
        self.move_output(node, k, t, 0)
        self.set_input(t, 0, node.outputs[k])
        if dims is not None and len(dims) == len(perm_inv):
            self.set_shape(node.outputs[k], old, [dims[p] for p in perm_inv])
        return old

    def transpose_outputs(self, node: RuntimeNode, perm: list[int]) -> None:
        if perm == list(range(len(perm))):
            return
        inv = _invert_perm(perm)
        for k, o in enumerate(node.outputs):
            if o:
                self.transpose_output(node, k, perm, inv)

    def unsqueeze_input(self, node: RuntimeNode, i: int, axes: list[int]) -> None:
        rg = self.rg
        inp = node.inputs[i]
        self.set_input(node, i, "")
        if self.is_constant(inp):  # Case 1: reshape the constant (its other readers get a Squeeze)
            others = [r for r in self.readers(inp) if r.index != node.index]
            dims = self.shape(inp)
            if others:
                sq = self.make_squeeze_or_unsqueeze("Squeeze", inp, axes)
                if dims is not None:
                    self.set_shape(sq.outputs[0], inp, dims)
                for r in others:
                    for k, x in enumerate(r.inputs):
                        if x == inp:
                            self.set_input(r, k, sq.outputs[0])
            if dims is not None:
                self.set_shape(inp, inp, _unsqueeze_shape(dims, axes))
            self.set_input(node, i, inp)
            return
        producer = rg.node_of(inp)
        if producer is not None and producer.key == ("", "Squeeze") and self.read_axes(producer) == axes:
            self.set_input(node, i, producer.inputs[0])  # Case 2: undo a Squeeze
            if not rg.consumers.get(inp) and self.comprehensive(inp):
                self.remove(producer)
            return
        un = self.make_squeeze_or_unsqueeze("Unsqueeze", inp, axes)  # Case 3
        if producer is not None and producer.key == ("", "Transpose"):
            perm = _valid_perm(producer.attrs.get("perm"))
            if perm is not None:
                self.transpose_input(un, 0, _invert_perm(perm), perm)
                new_perm = _unsqueeze_perm(axes, perm)
                self.set_input(node, i, self.transpose_output(un, 0, new_perm, _invert_perm(new_perm)))
                return
        self.set_input(node, i, un.outputs[0])

    def make_squeeze_or_unsqueeze(self, op: str, inp: str, axes: list[int]) -> RuntimeNode:
        name = self.new_name(op)
        attrs: dict = {}
        inputs = [inp]
        if self.opset < 13:
            attrs["axes"] = list(axes)
        else:
            inputs.append(self.add_int64_initializer(axes))
        node = self.rg.add(name, op, "", inputs, [name + "_out0"], attrs, ())
        dims = self.shape(inp)
        if dims is not None:
            self.set_shape(
                node.outputs[0],
                inp,
                _unsqueeze_shape(dims, axes)
                if op == "Unsqueeze"
                else [d for k, d in enumerate(dims) if k not in set(axes)],
            )
        return node

    def read_axes(self, node: RuntimeNode) -> list[int] | None:
        if self.opset < 13 or (node.op.startswith("Reduce") and node.op != "ReduceSum" and self.opset < 18):
            axes = node.attrs.get("axes")
            return None if axes is None else [int(a) for a in axes]
        if len(node.inputs) < 2 or not node.inputs[1]:
            return None
        value = constant_value(self.rg, node.inputs[1]) if self.rg.is_constant(node.inputs[1]) else None
        return None if value is None else [int(a) for a in np.asarray(value).reshape(-1)]

    # -- handlers -----------------------------------------------------------------------------

    def handle(self, kind: str, node: RuntimeNode, transpose: RuntimeNode, perm: list[int], indices: list[int]) -> bool:
        """Push ``transpose`` (permutation ``perm``) through ``node``, which reads it, by the handler
        ``kind``: the inputs ``indices`` get the inverse permutation, the outputs a Transpose each.
        False where the handler declines (nothing has changed then)."""
        inv = _invert_perm(perm)
        if kind == "transpose":
            return self.handle_transpose(node, transpose, perm, inv)
        if kind in ("simple", "first", "broadcast"):
            return self.handle_elementwise(kind, node, perm, inv, indices)
        if kind in ("softmax", "concat", "split"):
            return self.handle_axis(kind, node, perm, inv, indices)
        if kind == "reduce":
            return self.handle_reduce(node, perm, inv)
        if kind == "squeeze":
            return self.handle_squeeze(node, perm, inv)
        if kind == "unsqueeze":
            return self.handle_unsqueeze(node, perm, inv)
        return False

    def handle_transpose(self, node: RuntimeNode, transpose: RuntimeNode, perm: list[int], inv: list[int]) -> bool:
        """A Transpose after ``transpose``: both cancel, or the two permutations become one."""
        node_perm = _valid_perm(node.attrs.get("perm"))
        if node_perm is None or len(node_perm) != len(perm):
            return False
        if node_perm == inv:
            return self.cancel_transposes(transpose, node)
        self.set_input(node, 0, transpose.inputs[0])
        node.attrs["perm"] = _compose_perm(perm, node_perm)
        self.rg.touch(node)
        node.origin = node.origin + transpose.origin
        if not self.rg.consumers.get(transpose.outputs[0]) and self.comprehensive(transpose.outputs[0]):
            self.remove(transpose)
        return True

    def handle_elementwise(
        self, kind: str, node: RuntimeNode, perm: list[int], inv: list[int], indices: list[int]
    ) -> bool:
        """An element-wise op (``simple``, ``first``, ``broadcast``): its inputs ``indices`` transposed
        (those of lower rank of a broadcasting op unsqueezed to the rank first), its outputs too."""
        rank = len(perm)
        if kind == "broadcast":
            ranks = []
            for i in indices:
                dims = self.shape(node.inputs[i])
                if dims is None or len(dims) > rank:
                    return False
                ranks.append(len(dims))
            for i, r in zip(indices, ranks):
                if r < rank:
                    self.unsqueeze_input(node, i, list(range(rank - r)))
        for i in indices:
            self.transpose_input(node, i, inv, perm)
        self.transpose_outputs(node, perm)
        return True

    def handle_axis(self, kind: str, node: RuntimeNode, perm: list[int], inv: list[int], indices: list[int]) -> bool:
        """An op along one ``axis`` (``softmax``, ``concat``, ``split``): the axis permuted. A Softmax
        below opset 13 (which flattens from its axis on) keeps its axis, where the permutation maps
        the axes before it among themselves."""
        rank = len(perm)
        if kind == "softmax" and self.opset < 13:
            axis = int(node.attrs.get("axis", 1))
            axis = axis + rank if axis < 0 else axis
            if not 0 <= axis < rank or any((i < axis) != (perm[i] < axis) for i in range(rank)):
                return False
            self.transpose_input(node, 0, inv, perm)
            self.transpose_outputs(node, perm)
            return True
        default: int | None = {"softmax": -1, "split": 0, "concat": None}[kind]
        given = node.attrs.get("axis", default)
        if given is None:
            return False
        axis = int(given) + rank if int(given) < 0 else int(given)
        if not 0 <= axis < rank:
            return False
        for i in indices:
            self.transpose_input(node, i, inv, perm)
        self.transpose_outputs(node, perm)
        node.attrs["axis"] = perm[axis]
        self.rg.touch(node)
        return True

    def handle_squeeze(self, node: RuntimeNode, perm: list[int], inv: list[int]) -> bool:
        """A Squeeze: its axes permuted, its output transposed by what is left of ``perm``."""
        axes = self.read_axes(node)
        axes = None if axes is None else _normalize_axes(axes, len(perm))
        if axes is None:
            return False
        new_axes = sorted(perm[a] for a in axes)
        self.set_axes(node, new_axes)
        self.transpose_input(node, 0, inv, perm)
        self.transpose_outputs(node, _squeeze_perm(new_axes, perm))
        return True

    def handle_unsqueeze(self, node: RuntimeNode, perm: list[int], inv: list[int]) -> bool:
        """An Unsqueeze: its output transposed by ``perm`` widened to the new axes."""
        axes = self.read_axes(node)
        axes = None if axes is None else _normalize_axes(axes, len(perm) + len(axes))
        if axes is None:
            return False
        self.transpose_input(node, 0, inv, perm)
        new_perm = _unsqueeze_perm(axes, perm)
        self.transpose_output(node, 0, new_perm, _invert_perm(new_perm))
        return True

    def set_axes(self, node: RuntimeNode, axes: list[int]) -> None:
        if self.opset < 13 or (node.op.startswith("Reduce") and node.op != "ReduceSum" and self.opset < 18):
            node.attrs["axes"] = list(axes)
            self.rg.touch(node)
        else:
            self.set_input(node, 1, self.add_int64_initializer(axes))

    def handle_reduce(self, node: RuntimeNode, perm: list[int], inv: list[int]) -> bool:
        keepdims = int(node.attrs.get("keepdims", 1)) != 0
        if (node.op == "ReduceSum" and self.opset < 13) or (node.op != "ReduceSum" and self.opset < 18):
            axes = node.attrs.get("axes")  # axes as an attribute
            if axes is None:
                self.transpose_input(node, 0, inv, perm)
                self.transpose_outputs(node, perm if keepdims else [])
                return True
        else:  # axes as an input
            name = node.inputs[1] if len(node.inputs) > 1 else ""
            if name and not self.rg.is_constant(name):
                return False
            value = constant_value(self.rg, name) if name else None
            if name and value is None:
                return False
            axes = None if value is None else [int(a) for a in np.asarray(value).reshape(-1)]
            if not axes:  # reduce over everything, or nothing
                noop = int(node.attrs.get("noop_with_empty_axes", 0)) != 0
                self.transpose_input(node, 0, inv, perm)
                if noop or keepdims:
                    self.transpose_outputs(node, perm)
                return True
        axes = _normalize_axes([int(a) for a in axes], len(perm))
        if axes is None:
            return False
        new_axes = sorted(perm[a] for a in axes)
        self.set_axes(node, new_axes)
        self.transpose_input(node, 0, inv, perm)
        self.transpose_outputs(node, perm if keepdims else _squeeze_perm(new_axes, perm))
        return True

    def cancel_transposes(self, first: RuntimeNode, second: RuntimeNode) -> bool:
        """The second Transpose undoes the first: its readers read the first's input. (When the
        second writes a graph output onnxruntime moves that output onto the first's producer;
        rare in training graphs, not emulated: nothing changes.)"""
        rg = self.rg
        src, out = first.inputs[0], second.outputs[0]
        if not self.comprehensive(out):
            return False
        rg.rewire(out, src)
        rg.remove(second)
        if not rg.consumers.get(first.outputs[0]) and self.comprehensive(first.outputs[0]):
            self.remove(first)
        return True

    # -- the pass -----------------------------------------------------------------------------

    def input_cost(self, node: RuntimeNode, perm: list[int], indices: list[int]) -> int:
        cost = 0
        for i in indices:
            t = node.inputs[i]
            if not t or self.is_constant(t):
                continue
            producer = self.rg.node_of(t)
            if producer is not None and producer.key == ("", "Transpose"):
                perm2 = _valid_perm(producer.attrs.get("perm"))
                if perm2 is not None:
                    cost += -self.rank_cost(t) if perm2 == perm and self.likely_removable(producer) else 0
                    continue
            cost += self.rank_cost(t)
        return cost

    def likely_removable(self, transpose: RuntimeNode) -> bool:
        out = transpose.outputs[0]
        return self.comprehensive(out) and all(self.kind(r) is not None for r in self.readers(out))

    def run(self) -> bool:
        rg = self.rg
        order = rg.default_order()
        leading: set[str] = set()
        for idx in reversed(order):
            node = rg.at(idx)
            if node.key == ("", "Transpose"):
                leading.add(node.inputs[0])
                continue
            kind = self.kind(node)
            if kind is None or kind in _TP_NO_OUTPUT_TRANSPOSE:
                continue
            if any(o in leading for o in node.outputs if o):
                leading.update(node.inputs[j] for j in self.transposible(node, kind) if node.inputs[j])
        for idx in order:
            current = rg.nodes[idx]
            if current is None:
                continue
            node = current
            for j, inp in enumerate(list(node.inputs)):
                if not inp:
                    continue
                transpose = rg.node_of(inp)
                if transpose is None or transpose.key != ("", "Transpose"):
                    continue
                perm = _valid_perm(transpose.attrs.get("perm"))
                if perm is None:
                    continue
                if self.process(transpose, node, perm, j, leading):
                    self.changed = True
                    rg.rewrites["TransposeOptimizer"] += 1
                    break
        return self.changed

    def process(self, transpose: RuntimeNode, node: RuntimeNode, perm: list[int], j: int, leading: set[str]) -> bool:
        kind = self.kind(node)
        if kind is None or kind in _TP_INERT:
            return False
        indices = self.transposible(node, kind)
        if j not in indices:
            return False
        if kind != "transpose":
            cost = self.input_cost(node, perm, indices)
            if cost < 0 and kind not in _TP_NO_OUTPUT_TRANSPOSE:
                outs = [o for o in node.outputs if o]
                if not any(o in leading for o in outs):
                    cost += max((self.rank_cost(o) for o in outs), default=0)
            if cost >= 0:
                return False
        return self.handle(kind, node, transpose, perm, indices)


def _unsqueeze_shape(dims, axes: list[int]) -> list:
    new_rank = len(dims) + len(axes)
    out: list = [None] * new_rank
    for a in axes:
        out[a] = 1
    it = iter(dims)
    return [1 if out[i] == 1 else next(it) for i in range(new_rank)]


class TransposeOptimizer(GraphPass):
    name = "TransposeOptimizer"
    ops = (("", "Transpose"),)

    def apply(self, rg: RuntimeGraph) -> bool:
        if not 7 <= rg.opset <= 21:
            return False
        return _Pusher(rg, rg.opset).run()
