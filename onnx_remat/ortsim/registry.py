"""Is this a graph onnxruntime-training 1.19 can load? Judged without starting a session.

``onnx.checker`` alone is the wrong judge for training graphs: onnxruntime registers ops of its
own in the default domain (``LayerNormalization`` before opset 17, ``SimplifiedLayerNormalization``,
``MaxPoolGrad``, ... see :mod:`onnx_remat.ortsim.ops_table`), its training optimizer writes them into every
``training_model.onnx``, and the checker rejects them ("No Op registered for
SimplifiedLayerNormalization with domain_version of 17"). :func:`check_runtime_support` checks

1. the IR version and the default-domain opset against what onnxruntime 1.19 loads (<= 10, <= 21);
2. every node's op against ONNX's schemas at the model's opset, onnxruntime's own ops
   (:mod:`onnx_remat.ortsim.ops_table`) and the model's local functions, and that its domain is imported;
3. everything else ``onnx.checker`` checks (graph structure, topological order, attributes of
   standard ops), on a copy in which onnxruntime's own default-domain nodes are moved to a domain
   the checker does not know, so that it skips them; the copy holds no tensor data;
4. types, shapes and initializer data as onnxruntime's load judges them
   (:mod:`onnx_remat.ortsim.validity`): strict shape inference with type checks on that copy,
   and every initializer's data against its dims.

Each failure is a one-line :class:`~onnx_remat.errors.RematError` that names what is wrong.
"""

from __future__ import annotations

import os

import onnx

from onnx_remat.errors import RematError, one_line
from onnx_remat.graph.conventions import SUBGRAPH_ATTRIBUTES
from onnx_remat.graph.skeleton import INFERENCE_DATA_BYTES, skeleton_bytes, skeleton_header
from onnx_remat.ortsim import ops_table as ort_ops
from onnx_remat.ortsim.validity import check_initializer_data, check_types_and_shapes

MAX_IR_VERSION = 10
MAX_OPSET = 21
_DEFAULT_DOMAINS = ("", "ai.onnx")
_ONNX_DOMAINS = ("ai.onnx.ml", "ai.onnx.preview.training")
# Where the checker's copy puts onnxruntime's own default-domain nodes: an unknown domain, which
# onnx.checker does not look into.
_SKIPPED_DOMAIN = "onnx_remat.onnxruntime_only"


def _imports(model: onnx.ModelProto) -> dict[str, int]:
    out: dict[str, int] = {}
    for op in model.opset_import:
        out["" if op.domain == "ai.onnx" else op.domain] = op.version
    return out


def runtime_only(op_type: str, opset: int) -> bool:
    """True if onnxruntime registers default-domain ``op_type`` at ``opset`` and ONNX does not."""
    return any(lo <= opset <= hi for lo, hi in ort_ops.ONNX_DOMAIN_OPSETS.get(op_type, ()))


def op_known(op_type: str, domain: str, imports: dict[str, int], functions: set[tuple[str, str]]) -> bool:
    """Whether onnxruntime 1.19 knows ``domain::op_type`` given the model's opset imports."""
    domain = "" if domain == "ai.onnx" else domain
    if (domain, op_type) in functions:
        return True
    version = imports.get(domain)
    if version is None:
        return False
    if domain == "":
        return onnx.defs.has(op_type, version, "") or runtime_only(op_type, version)
    if domain in _ONNX_DOMAINS:
        return onnx.defs.has(op_type, version, domain)
    return op_type in ort_ops.DOMAIN_OPS.get(domain, frozenset())


def _check_names(node: onnx.NodeProto, where: str | os.PathLike) -> None:
    """Names that are not valid UTF-8 reach Python as bytes (protobuf hands them over undecoded):
    refuse them here, with the node's position, rather than fail on them anywhere later."""
    try:
        # str.join refuses bytes: one C call for the usual all-text node (asked for every node)
        "".join((node.name, node.op_type, node.domain, node.doc_string, *node.input, *node.output))
        if node.attribute:
            "".join([a.name for a in node.attribute])
        if node.metadata_props:
            "".join([x for p in node.metadata_props for x in (p.key, p.value)])
        return
    except TypeError:
        pass
    names = [node.name, node.op_type, node.domain, node.doc_string, *node.input, *node.output]
    names += [a.name for a in node.attribute]
    names += [x for p in node.metadata_props for x in (p.key, p.value)]
    if not all(isinstance(x, str) for x in names):
        shown = next(x for x in names if not isinstance(x, str))
        raise RematError(f"{where}: a node's name, op, tensor or doc string is not valid UTF-8 text: {shown[:40]!r}")


def _check_graph_names(model: onnx.ModelProto, where: str | os.PathLike) -> None:
    graph = model.graph
    texts = [vi.name for vi in [*graph.input, *graph.output, *graph.value_info, *graph.initializer]]
    texts += [model.doc_string, graph.doc_string, graph.name, model.producer_name]
    texts += [x for p in model.metadata_props for x in (p.key, p.value)]
    bad = next((t for t in texts if not isinstance(t, str)), None)
    if bad is not None:
        raise RematError(f"{where}: a name or doc string of the graph is not valid UTF-8 text: {bad[:40]!r}")


def check_text(model: onnx.ModelProto, where: str | os.PathLike = "model") -> None:
    """Raise a one-line :class:`RematError` if a name, op type or doc string of ``model`` is not
    valid UTF-8 (protobuf hands such strings to Python as bytes, and every later step would trip
    on them). Part of :func:`check_runtime_support`; the commands that leave the rest of the
    judgement to onnxruntime's own load (``measure``, ``compare``) call it alone."""
    _check_graph_names(model, where)
    for node in _nodes(model.graph):
        _check_names(node, where)


def has_runtime_ops(model: onnx.ModelProto) -> bool:
    """True when ``model`` holds ops that ONNX's checker and shape inference cannot judge:
    onnxruntime's own (its domains, or default-domain ops only it registers). Their types and
    attributes are checked only by onnxruntime's load (every training graph has them)."""
    opset = _imports(model).get("")
    for node in _nodes(model.graph):
        domain = "" if node.domain == "ai.onnx" else node.domain
        if domain not in ("", *_ONNX_DOMAINS):
            return True
        if domain == "" and opset is not None and runtime_only(node.op_type, opset):
            return True
    return False


def _nodes(graph: onnx.GraphProto):
    """Nodes of ``graph`` and of its subgraphs (iterative)."""
    stack = [graph]
    while stack:
        g = stack.pop()
        for node in g.node:
            yield node
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    stack.append(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    stack.extend(attr.graphs)


def check_runtime_support(
    model: onnx.ModelProto, where: str | os.PathLike = "model", *, shapes: bool = False
) -> onnx.ModelProto | None:
    """Raise a one-line :class:`RematError` if onnxruntime-training 1.19 would refuse ``model``.

    ``where`` names the model in the message (a path, or "rewritten model"). With ``shapes``
    (where a model is read: once per command), strict type and shape inference too
    (:func:`~onnx_remat.ortsim.validity.check_types_and_shapes`), which raises a
    :class:`~onnx_remat.ortsim.validity.ShapeSuspicion` for what only onnxruntime's load can settle,
    and returns the model's skeleton as that inference typed it, with the data of initializers up to
    :data:`~onnx_remat.graph.skeleton.INFERENCE_DATA_BYTES` (what
    :class:`~onnx_remat.analysis.sizes.TensorSizes` infers on: its ``inferred``, so a command infers
    the graph once). Without ``shapes``, returns None.
    """
    if model.ir_version > MAX_IR_VERSION:
        raise RematError(
            f"{where}: IR version {model.ir_version} is newer than onnxruntime 1.19 loads (<= {MAX_IR_VERSION}); "
            "re-export, or set model.ir_version if nothing newer is used"
        )
    imports = _imports(model)
    opset = imports.get("")
    if opset is not None and opset > MAX_OPSET:
        raise RematError(f"{where}: default-domain opset {opset} is newer than onnxruntime 1.19 runs (<= {MAX_OPSET})")
    functions = {(f.domain, f.name) for f in model.functions}
    unknown: dict[tuple[str, str], str] = {}
    missing_domains: set[str] = set()
    _check_graph_names(model, where)
    known: set[tuple[str, str]] = set()  # op_known's answers, asked once per op rather than per node
    for node in _nodes(model.graph):
        _check_names(node, where)
        domain = "" if node.domain == "ai.onnx" else node.domain
        if (domain, node.op_type) in known or (domain, node.op_type) in unknown:
            continue
        if domain not in imports and (domain, node.op_type) not in functions:
            missing_domains.add(domain or "ai.onnx")
            continue
        if op_known(node.op_type, domain, imports, functions):
            known.add((domain, node.op_type))
        else:
            unknown[(domain, node.op_type)] = node.name or node.op_type
    if missing_domains:
        raise RematError(f"{where}: nodes use domain(s) without an opset import: {', '.join(sorted(missing_domains))}")
    if unknown:
        shown = [
            f"{op} ({'domain ' + d if d else 'opset ' + str(opset)}, node {name!r})"
            for (d, op), name in list(unknown.items())[:3]
        ]
        more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        raise RematError(f"{where}: ops onnxruntime 1.19 does not know: {', '.join(shown)}{more}")
    check_initializer_data(model, where)
    return _check_structure(model, where, opset, shapes)


def _check_structure(
    model: onnx.ModelProto, where: str | os.PathLike, opset: int | None, shapes: bool
) -> onnx.ModelProto | None:
    """``onnx.checker`` on a skeleton of ``model`` (:mod:`~onnx_remat.graph.skeleton`: no tensor
    data, initializers as typed graph inputs), onnxruntime-only nodes moved where it skips them;
    with ``shapes``, strict inference on it too, whose typed skeleton is returned. With ``shapes``
    the skeleton keeps the small initializers' data that inference reads (a Reshape's shape), as
    :class:`~onnx_remat.analysis.sizes.TensorSizes`'s does: the data were checked already
    (:func:`~onnx_remat.ortsim.validity.check_initializer_data`)."""
    header = skeleton_header(model, keep_data_upto=INFERENCE_DATA_BYTES if shapes else -1)
    only_runtime: dict[str, bool] = {}  # runtime_only per op type, asked once per op
    moved = False

    def moves(node: onnx.NodeProto) -> bool:
        if opset is None or node.domain not in _DEFAULT_DOMAINS:
            return False
        found = only_runtime.get(node.op_type)
        if found is None:
            found = only_runtime[node.op_type] = runtime_only(node.op_type, opset)
        return found

    def move(node: onnx.NodeProto) -> onnx.NodeProto | None:
        nonlocal moved
        has_subgraphs = bool(node.attribute) and any(a.type in SUBGRAPH_ATTRIBUTES for a in node.attribute)
        if not has_subgraphs and not moves(node):
            return None
        holder = onnx.GraphProto()  # _nodes walks a graph: the copy and its subgraphs
        holder.node.add().CopyFrom(node)
        for inner in _nodes(holder):
            if moves(inner):
                inner.domain = _SKIPPED_DOMAIN
                moved = True
        return holder.node[0]

    serialized = skeleton_bytes(header, model.graph, move)
    if moved:  # the skipped domain's import, appended on the wire (it merges into opset_import)
        extra = onnx.ModelProto()
        extra.opset_import.add(domain=_SKIPPED_DOMAIN, version=1)
        serialized += extra.SerializeToString()
    try:
        onnx.checker.check_model(serialized)
    except onnx.checker.ValidationError as exc:
        raise RematError(f"{where}: invalid ONNX model: {one_line(exc)}") from None
    if not shapes:
        return None
    return check_types_and_shapes(header, where, serialized=serialized)
