"""Helpers for exporting PyTorch modules into ONNX graphs that onnx-remat and
``onnxruntime.training.artifacts.generate_artifacts`` (onnxruntime-training 1.19) can use.

* :func:`add_gradient_outputs` adds the optional outputs onnxruntime's gradient builders read
  and exporters leave off (``Dropout`` mask, ``LayerNormalization`` mean and inverse std-dev);
  needed for TorchScript exports with LayerNorm too.
* :func:`fix_dynamo_training_export` repairs what the dynamo exporter (``torch.onnx.export(...,
  dynamo=True)``) writes so that ``generate_artifacts`` can build its gradient graph: every
  ``Dropout`` gets its mask output (the ``DropoutGrad`` builder reads it), and source paths are
  dropped from node metadata (they make the file depend on where the code was checked out).
* :func:`fix_eval_model` repairs the ``eval_model.onnx`` that ``generate_artifacts`` writes for
  a model with training-mode BatchNormalization (onnxruntime refuses it as written).
* :func:`trainable_parameter_names` lists the initializers that are real parameters of the
  module (the dynamo exporter turns constants into initializers too, and asking for their
  gradients makes ``generate_artifacts`` fail).
* :func:`annotate_scopes` gives the nodes of a TorchScript export (``dynamo=False``) the same
  scope metadata the dynamo exporter writes (``pkg.torch.onnx.name_scopes`` and
  ``pkg.torch.onnx.class_hierarchy``), so scopes can be matched by module path or by class name
  whichever exporter made the graph.

* :func:`export_for_training` does it all in one call: the export (either exporter) with every
  fix above, ready for ``generate_artifacts``.

Only :func:`export_for_training` imports torch (when called); the others take the module only to
read its ``named_modules()`` and ``named_parameters()``.

A typical TorchScript export::

    torch.onnx.export(module, args, "m.onnx", dynamo=False, opset_version=17,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    model = annotate_scopes(add_gradient_outputs(onnx.load("m.onnx")), module)
    generate_artifacts(model, requires_grad=trainable_parameter_names(model, module), ...)

(TorchScript's export in training mode runs the module once: BatchNorm running statistics are
updated by it and exported updated.) A dynamo one::

    model = torch.onnx.export(module, args, dynamo=True, opset_version=18,
                              training=torch.onnx.TrainingMode.TRAINING).model_proto
    model = fix_dynamo_training_export(model)
    generate_artifacts(model, requires_grad=trainable_parameter_names(model, module, strict=True), ...)

(the dynamo exporter's default ``optimize=True`` merges small initializers with equal values,
parameters included; ``strict=True`` catches it, ``optimize=False`` avoids it.)

``generate_artifacts`` keeps node names in ``training_model.onnx`` except where onnxruntime's
training transformers replace nodes: BatchNormalization becomes ``<name>_BatchNormInternal``, an
Erf-based GELU becomes one ``com.microsoft`` ``Gelu`` named ``Gelu``, ``Gelu_token_0``, ..., a
Transpose of a weight with a unit dimension becomes ``Transpose_Reshape``. Such nodes keep the
output tensor names of the nodes they replace, so their scope is that of the ``eval_model.onnx``
node producing the same output.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

import onnx

NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
CLASS_HIERARCHY_KEY = "pkg.torch.onnx.class_hierarchy"
NAMESPACE_KEY = "namespace"
# Written by the dynamo exporter: the Python stack of the op, with absolute source file paths.
STACK_TRACE_KEY = "pkg.torch.onnx.stack_trace"

_DEFAULT_DOMAINS = ("", "ai.onnx")


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """A deep copy of ``model``."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph (If/Loop/Scan bodies) inside it, depth first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _graphs(g)


def _all_names(model: onnx.ModelProto) -> set[str]:
    """Every tensor name used anywhere in the model (graph, subgraphs and local functions)."""
    names: set[str] = set()
    for graph in _graphs(model.graph):
        names.update(i.name for i in graph.input)
        names.update(o.name for o in graph.output)
        names.update(t.name for t in graph.initializer)
        names.update(v.name for v in graph.value_info)
        for node in graph.node:
            names.update(node.input)
            names.update(node.output)
    for fn in model.functions:
        names.update(fn.input)
        names.update(fn.output)
        for node in fn.node:
            names.update(node.input)
            names.update(node.output)
    names.discard("")
    return names


def _unique(base: str, taken: set[str]) -> str:
    """``base``, or ``base_1``, ``base_2`` ... if taken; the name returned is added to ``taken``."""
    name, k = base, 1
    while name in taken:
        name = f"{base}_{k}"
        k += 1
    taken.add(name)
    return name


# Optional outputs that onnxruntime-training's gradient builders read (gradient_builder.cc):
# op type -> names of the outputs after the first, in order. The exporters often leave them off.
_GRADIENT_OUTPUTS: dict[str, tuple[str, ...]] = {
    "Dropout": ("mask",),  # DropoutGrad(dY, mask, ratio, training_mode)
    "LayerNormalization": ("mean", "inv_std_dev"),  # LayerNormalizationGrad(dY, X, scale, mean, inv_std)
}
# Not MaxPool: its builder can read the Indices output, but a TorchScript MaxPool given one
# trains with wrong gradients in onnxruntime 1.19.2 (measured), while without it the gradient is
# built from input and output and is right.


def _fix_node_outputs(nodes: Iterable[onnx.NodeProto], taken: set[str]) -> int:
    """Add the missing outputs of :data:`_GRADIENT_OUTPUTS` to ``nodes``; returns how many."""
    count = 0
    for node in nodes:
        extra = _GRADIENT_OUTPUTS.get(node.op_type)
        if extra is None or node.domain not in _DEFAULT_DOMAINS or not node.output or not node.output[0]:
            continue
        for k, suffix in enumerate(extra, start=1):
            name = f"{node.output[0]}_{suffix}"
            if len(node.output) <= k:
                node.output.append(_unique(name, taken))
                count += 1
            elif not node.output[k]:
                node.output[k] = _unique(name, taken)
                count += 1
    return count


def _all_node_lists(model: onnx.ModelProto) -> Iterator[Any]:
    """The node lists of the main graph, its subgraphs, local functions and their subgraphs."""
    for graph in _graphs(model.graph):
        yield graph.node
    for fn in model.functions:
        yield fn.node
        for node in fn.node:
            for attr in node.attribute:
                subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
                for sub in subs:
                    for g in _graphs(sub):
                        yield g.node


def add_gradient_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """Return a copy of ``model`` whose nodes have the optional outputs gradient builders read.

    onnxruntime-training's gradient builders use optional forward outputs that exporters leave
    off; without them ``generate_artifacts`` fails with ``GradientBuilderBase::O(size_t, bool)
    const i < node_->OutputDefs().size() was false``. Added (named ``<output 0>_<suffix>``, made
    unique):

    * ``Dropout``: output 1, the mask (``_mask``). The dynamo exporter writes Dropout without it.
    * ``LayerNormalization``: outputs 1 and 2, mean and inverse standard deviation (``_mean``,
      ``_inv_std_dev``). Both exporters (TorchScript at opset 17+) write LayerNormalization with
      ``Y`` only.

    ``MaxPool`` is left alone on purpose: given its ``Indices`` output, onnxruntime 1.19.2 builds
    a gradient from it that is wrong for a TorchScript export (checked against PyTorch); without
    it the gradient is right.

    Default-domain nodes in the main graph, subgraphs and model-local functions are fixed; an
    output that is already there is kept. The input model is not changed.
    """
    fixed = _copy(model)
    taken = _all_names(fixed)
    for nodes in _all_node_lists(fixed):
        _fix_node_outputs(nodes, taken)
    return fixed


def fix_dynamo_training_export(model: onnx.ModelProto) -> onnx.ModelProto:
    """Return a copy of a dynamo-exported training-mode model that ``generate_artifacts`` accepts.

    * Every ``Dropout`` node without a mask output gets one, named ``<output>_mask`` (made unique
      if that name is taken): the dynamo exporter writes ``Dropout`` with its data output only,
      and onnxruntime's gradient builder for ``Dropout`` reads output 1 (it fails with
      ``GradientBuilderBase::O(size_t, bool) const i < node_->OutputDefs().size() was false``).
      ``LayerNormalization`` gets its optional outputs the same way; see
      :func:`add_gradient_outputs`.
    * ``pkg.torch.onnx.stack_trace`` node metadata is removed: it holds absolute source paths, so
      the same export from two checkouts would differ. The scope metadata
      (``pkg.torch.onnx.name_scopes``, ``pkg.torch.onnx.class_hierarchy``, ``namespace``) stays.

    The other thing a dynamo export needs is the right ``requires_grad`` list (constants are
    initializers too): see :func:`trainable_parameter_names`. The input model is not changed.
    """
    fixed = add_gradient_outputs(model)
    for nodes in _all_node_lists(fixed):
        for node in nodes:
            keep = [p for p in node.metadata_props if p.key != STACK_TRACE_KEY]
            if len(keep) != len(node.metadata_props):
                del node.metadata_props[:]
                node.metadata_props.extend(keep)
    return fixed


def fix_eval_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """Return a copy of an ``eval_model.onnx`` written by ``generate_artifacts`` that onnxruntime loads.

    ``generate_artifacts`` makes the eval model by switching training mode off: it sets
    ``training_mode=0`` on ``BatchNormalization`` but leaves the running-statistics outputs a
    training-mode export has (TorchScript writes three), and onnxruntime then refuses the model
    (``[ShapeInferenceError] This number of op outputs should be 1 when Training_mode = False``).
    This drops outputs 1 and 2 of every ``BatchNormalization`` that is not in training mode when
    no node and no graph output uses them. Node names and metadata are kept; the input model is
    not changed. Models without such nodes come back unchanged (as a copy).
    """
    fixed = _copy(model)
    node_lists = [list(nodes) for nodes in _all_node_lists(fixed)]
    used = {i for nodes in node_lists for n in nodes for i in n.input}
    for graph in _graphs(fixed.graph):
        used.update(o.name for o in graph.output)
    for fn in fixed.functions:
        used.update(fn.output)
    for nodes in node_lists:
        for node in nodes:
            if node.op_type != "BatchNormalization" or node.domain not in _DEFAULT_DOMAINS:
                continue
            training = any(a.name == "training_mode" and a.i for a in node.attribute)
            if training or len(node.output) <= 1:
                continue
            if any(o and o in used for o in node.output[1:]):
                continue
            del node.output[1:]
    return fixed


def trainable_parameter_names(model: onnx.ModelProto, module: Any, *, strict: bool = False) -> list[str]:
    """Names of the initializers of ``model`` that are trainable parameters of ``module``.

    A parameter counts when ``module.named_parameters()`` has it with ``requires_grad`` set and an
    initializer of that exact name exists (both exporters name parameter initializers by module
    path, e.g. ``blocks.0.y``). Constants (the dynamo exporter's ``val_0`` ...), buffers (BatchNorm
    running statistics, masks) and frozen parameters are left out. Order: that of the
    initializers in the graph. Pass the result as ``requires_grad`` to ``generate_artifacts``
    (asking it for the gradient of a constant fails with ``failed to find NodeArg by name:
    val_4_grad``).

    A trainable parameter without an initializer is either unused by the forward pass or was
    merged away: the dynamo exporter's default ``optimize=True`` deduplicates small initializers
    with equal values, so for example a fresh ``BatchNorm`` weight (all ones) can end up sharing
    the initializer of a ``LayerNorm`` weight, silently tying them in training (export with
    ``optimize=False`` to avoid it). With ``strict=True`` such parameters raise ``ValueError``.
    """
    # A tied parameter (GPT-2's input embedding = LM head) has several names; named_parameters()
    # gives the first, while an exporter may name the initializer after any of them.
    aliases: dict[int, list[str]] = {}
    trainable: list[int] = []
    for name, p in module.named_parameters(remove_duplicate=False):
        if id(p) not in aliases:
            aliases[id(p)] = []
            if getattr(p, "requires_grad", True):
                trainable.append(id(p))
        aliases[id(p)].append(name)
    wanted = {name for pid in trainable for name in aliases[pid]}
    seen: set[str] = set()
    out: list[str] = []
    for init in model.graph.initializer:
        if init.name in wanted and init.name not in seen:
            seen.add(init.name)
            out.append(init.name)
    if strict:
        missing = [aliases[pid][0] for pid in trainable if not any(n in seen for n in aliases[pid])]
        if missing:
            raise ValueError(
                f"{len(missing)} trainable parameter(s) of the module have no initializer in the "
                f"model: {', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''} (unused by "
                "forward, or merged with an equal initializer by the dynamo exporter's optimizer: "
                "export with optimize=False)"
            )
    return out


def _qualname(obj: Any) -> str:
    """``module.QualName`` of ``obj``'s class, as the dynamo exporter writes it."""
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _op_label(node: onnx.NodeProto) -> str:
    """The last ``class_hierarchy`` element of a node: its op type (``domain.op_type`` outside
    the default domain)."""
    if node.domain in _DEFAULT_DOMAINS:
        return node.op_type
    return f"{node.domain}.{node.op_type}"


def resolve_module_paths(
    components: list[str], modules: Mapping[str, Any], *, ends: Mapping[str, list[str]] | None = None
) -> list[str] | None:
    """Full module paths for the scope components of a TorchScript node name, or None.

    TorchScript names a scope mostly relative to its parent scope (``/blocks.0/drop/Dropout``:
    the ModuleList child ``blocks.0`` under the root, then ``drop`` under it), so a path is the
    running ``.``-join; but children with numeric names appear with their full path
    (``/seq/seq.0/Gemm``, ``/layers.0/layers.0.1/bn1/...`` for a Sequential's children), so a
    component that is itself a full ``named_modules()`` key is taken as such when the join is
    not one; and a Sequential's child is named relative to the Sequential's parent
    (``/stages.0/layers/layers.0/dwconv``: ``stages.0.layers.0``, seen in ConvNeXt), so the
    join with the parent of the running path is tried next. Last, a module that calls a
    grandchild directly (Hugging Face's ``OPTForCausalLM.forward`` calls ``self.model.decoder``)
    gets a scope named after the grandchild right under its own (``/model/decoder/layers.0``
    for ``model.model.decoder.layers.0``): the component is then the one module below the
    running path, at the least depth, whose name ends with it. ``ends``: :func:`module_path_ends`
    of ``modules``, where the caller resolves many names (made here when needed otherwise).
    """
    paths: list[str] = []
    prefix = ""
    for comp in components:
        if not comp:
            return None
        candidate = f"{prefix}.{comp}" if prefix else comp
        beside = f"{prefix.rsplit('.', 1)[0]}.{comp}" if "." in prefix else None
        if candidate in modules:
            prefix = candidate
        elif comp in modules:
            prefix = comp
        elif beside is not None and beside in modules:
            prefix = beside
        else:
            if ends is None:
                ends = module_path_ends(modules)
            below = _shallowest_below(prefix, ends.get(comp, ()))
            if below is None:
                return None
            prefix = below
        paths.append(prefix)
    return paths


def module_path_ends(modules: Iterable[str]) -> dict[str, list[str]]:
    """Module paths by the last component of their name, shallowest first (for
    :func:`resolve_module_paths`)."""
    ends: dict[str, list[str]] = {}
    for path in modules:
        ends.setdefault(path.rsplit(".", 1)[-1], []).append(path)
    for paths in ends.values():
        paths.sort(key=lambda p: p.count("."))
    return ends


def _shallowest_below(prefix: str, paths: Sequence[str]) -> str | None:
    """The one path of ``paths`` (shallowest first) below ``prefix`` at the least depth, or None
    where there is none or more than one."""
    under = [p for p in paths if p.startswith(prefix + ".")] if prefix else list(paths)
    if not under:
        return None
    depth = under[0].count(".")
    if len(under) > 1 and under[1].count(".") == depth:
        return None  # two modules of that name at that depth: no telling which
    return under[0]


def annotate_scopes(model: onnx.ModelProto, module: Any, *, overwrite: bool = False) -> onnx.ModelProto:
    """Return a copy of a TorchScript export whose nodes carry the dynamo exporter's scope metadata.

    For every node named like ``/blocks.0/drop/Dropout`` (the TorchScript exporter's
    ``/<scope>/<scope>/<op name>``) this adds the node ``metadata_props``

    * ``pkg.torch.onnx.name_scopes``: ``"['', 'blocks.0', 'blocks.0.drop', 'Dropout']"``, a Python
      list literal: the root ``''``, the module path of every scope from outer to inner, then the
      node's own name (the last component of its ONNX name);
    * ``pkg.torch.onnx.class_hierarchy``: ``"['msdef.Net', 'msdef.Block',
      'torch.nn.modules.dropout.Dropout', 'Dropout']"``, the qualified classes
      (``f"{cls.__module__}.{cls.__qualname__}"``) of the root module and of every scope, aligned
      with ``name_scopes``, then the ONNX op type (``domain.op_type`` outside the default domain);
    * ``namespace``: ``": msdef.Net/blocks.0: msdef.Block/.../Dropout: Dropout"``, as dynamo writes.

    Module classes come from ``module.named_modules()`` (pass the module that was exported).
    Scope components are resolved against its keys: TorchScript writes a child relative to its
    parent (``/blocks.0/drop``) except numeric children of a Sequential, which it writes in full
    (``/seq/seq.0/Gemm`` is ``seq`` then ``seq.0``); both resolve to the dynamo exporter's paths.
    Nodes at the root (``/MatMul``) get ``['', 'MatMul']``. Nodes whose name is not of this form
    (no leading ``/``), or whose scopes do not resolve to submodules, are left unannotated; so
    are nodes that already carry ``name_scopes`` unless ``overwrite`` is set. Node names are not
    changed: ``generate_artifacts`` keeps them in ``training_model.onnx`` (where it drops node
    metadata), so the scope of a training-graph node can be looked up by name in
    ``eval_model.onnx``. The input model is not changed.
    """
    annotated = _copy(model)
    modules = {name: mod for name, mod in module.named_modules() if name}
    ends = module_path_ends(modules)
    root_class = _qualname(module)
    for graph in _graphs(annotated.graph):
        for node in graph.node:
            if not node.name.startswith("/"):
                continue
            existing = {p.key for p in node.metadata_props}
            if NAME_SCOPES_KEY in existing and not overwrite:
                continue
            parts = node.name.split("/")[1:]
            if not parts or not parts[-1]:
                continue
            paths = resolve_module_paths(parts[:-1], modules, ends=ends)
            if paths is None:
                continue
            scopes = ["", *paths, parts[-1]]
            classes = [root_class, *(_qualname(modules[p]) for p in paths), _op_label(node)]
            namespace = "/".join(f"{s}: {c}" for s, c in zip(scopes, classes))
            values = {
                NAME_SCOPES_KEY: repr(scopes),
                CLASS_HIERARCHY_KEY: repr(classes),
                NAMESPACE_KEY: namespace,
            }
            keep = [p for p in node.metadata_props if p.key not in values]
            del node.metadata_props[:]
            node.metadata_props.extend(keep)
            for key, value in values.items():
                node.metadata_props.add(key=key, value=value)
    return annotated


def _restore_initializers_from(model: onnx.ModelProto, values: dict[str, Any]) -> onnx.ModelProto:
    """A copy of ``model`` whose initializers named in ``values`` hold those (torch) values."""
    from onnx import numpy_helper

    out = _copy(model)
    for i, init in enumerate(out.graph.initializer):
        if init.name in values:
            out.graph.initializer[i].CopyFrom(
                numpy_helper.from_array(values[init.name].detach().cpu().numpy(), init.name)
            )
    return out


def _export_torchscript(module: Any, args: tuple, opset: int, input_names, output_names) -> onnx.ModelProto:
    import torch

    buffers = {k: v.detach().clone() for k, v in module.named_buffers()}
    f = io.BytesIO()
    torch.onnx.export(
        module,
        args,
        cast(Any, f),  # a file object works; the stubs name only paths
        dynamo=False,
        opset_version=opset,
        training=torch.onnx.TrainingMode.TRAINING,
        do_constant_folding=False,
        input_names=list(input_names),
        output_names=list(output_names),
    )
    # Tracing in training mode runs the module once: BatchNorm running statistics were updated
    # by it, in the module and in the exported initializers. Both go back to their old values.
    with torch.no_grad():
        for name, buf in module.named_buffers():
            buf.copy_(buffers[name])
    model = _restore_initializers_from(onnx.load_from_string(f.getvalue()), buffers)
    return annotate_scopes(add_gradient_outputs(model), module)


def _export_dynamo(module: Any, args: tuple, opset: int, input_names, output_names) -> onnx.ModelProto:
    import onnx_ir as ir
    import torch
    from onnxscript.optimizer import optimize_ir

    program = torch.onnx.export(
        module,
        args,
        dynamo=True,
        opset_version=opset,
        training=torch.onnx.TrainingMode.TRAINING,
        input_names=list(input_names),
        output_names=list(output_names),
        verbose=False,
        optimize=False,
    )
    assert program is not None  # dynamo=True always returns the program
    # The exporter's optimizer (optimize=True) is needed (it turns SplitToSequence + SequenceAt,
    # which have no gradient in onnxruntime, back into Split), but it treats parameters as
    # constants: it folds ops that read them (GPT-2's position embedding disappeared) and merges
    # parameters of equal value (every fresh LayerNorm weight is all ones), so they would no
    # longer be trained, or be trained tied. Parameters are turned into graph inputs while it
    # runs, and back into initializers after.
    trainable = {name for name, p in module.named_parameters(remove_duplicate=False) if p.requires_grad}
    graph = program.model.graph
    hidden = []
    for name in list(graph.initializers):
        if name in trainable:
            value = graph.initializers.pop(name)
            hidden.append((value, value.const_value))
            value.const_value = None
            graph.inputs.append(value)
    optimize_ir(program.model)
    for value, const in hidden:
        graph.inputs.remove(value)
        value.const_value = const
        graph.register_initializer(value)
    return fix_dynamo_training_export(ir.serde.serialize_model(program.model))


def export_for_training(
    module: Any,
    args: tuple,
    *,
    exporter: str = "torchscript",
    opset: int | None = None,
    input_names: Iterable[str] = (),
    output_names: Iterable[str] = ("output",),
) -> onnx.ModelProto:
    """Export ``module`` (a ``torch.nn.Module``) in training mode, ready for ``generate_artifacts``.

    ``exporter`` is ``"torchscript"`` (``torch.onnx.export(..., dynamo=False)``, default opset
    17) or ``"dynamo"`` (default opset 18). One call applies every fix this module knows:

    * TorchScript: no constant folding (parameters stay initializers named by module path);
      BatchNorm running statistics put back to their values before the export (tracing in
      training mode updates them); :func:`add_gradient_outputs`; :func:`annotate_scopes`.
    * dynamo: the exporter's optimizer runs with the trainable parameters hidden from it, so it
      neither folds them into constants nor merges equal ones; then
      :func:`fix_dynamo_training_export`.

    The module's parameters and buffers are the same afterwards. Pass
    ``trainable_parameter_names(model, module, strict=True)`` as ``generate_artifacts``'s
    ``requires_grad``.
    """
    import torch

    if exporter not in ("torchscript", "dynamo"):
        raise ValueError(f"exporter must be 'torchscript' or 'dynamo', not {exporter!r}")
    module.train()
    args = tuple(args)
    names = tuple(input_names)
    outs = tuple(output_names)
    import contextlib
    import logging
    import warnings

    with contextlib.ExitStack() as stack:
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")  # deprecation and train-mode warnings of the exporters
        log = logging.getLogger("torch.onnx")
        stack.callback(log.setLevel, log.level)
        log.setLevel(logging.ERROR)
        with torch.random.fork_rng():  # the export must not draw from the caller's generator
            if exporter == "torchscript":
                return _export_torchscript(module, args, opset or 17, names, outs)
            return _export_dynamo(module, args, opset or 18, names, outs)
