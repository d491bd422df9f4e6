"""Everything onnx-remat knows about a training graph before it changes anything, in one object.

:func:`analyze_model` loads the model (a file, an artifacts directory, a :class:`LoadedModel` or an
``onnx.ModelProto``) and runs the analysis passes: forward/backward split
(:mod:`onnx_remat.analysis.regions`), scope tree (:mod:`onnx_remat.analysis.scopes`, with ``eval_model.onnx``
from beside the training graph when there is one) and tensor sizes (:mod:`onnx_remat.analysis.sizes`).
The commands ``apply``, ``scopes``, ``estimate`` and ``viz`` all start from it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import onnx

from onnx_remat.analysis.regions import TrainingGraph, analyze
from onnx_remat.analysis.scopes import ScopeTree, resolve_scopes
from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.errors import ForwardOnlyGraph
from onnx_remat.graph.bridge import ModelGraph
from onnx_remat.model_io import LoadedModel, check_dim_names, check_loadable, forward_only_hint, load_model
from onnx_remat.ortsim.registry import check_text

ModelLike = str | os.PathLike | LoadedModel | onnx.ModelProto


@dataclass
class ModelAnalysis:
    """A loaded training graph with its analyses.

    ``source`` is None when the model was given as a ModelProto. ``graph`` holds the
    graphsurgeon graph the rewrite edits: analyse again before a second rewrite.
    """

    model: onnx.ModelProto
    source: LoadedModel | None
    graph: TrainingGraph
    scopes: ScopeTree
    sizes: TensorSizes

    @property
    def name(self) -> str:
        """How to call this model in messages: its path, or 'model'."""
        if self.source is None:
            return "model"
        return str(self.source.artifacts_dir or self.source.path)


def as_loaded(model: ModelLike) -> LoadedModel | None:
    """A :class:`LoadedModel` for paths and LoadedModels; None for an in-memory ModelProto."""
    if isinstance(model, LoadedModel):
        return model
    if isinstance(model, onnx.ModelProto):
        return None
    return load_model(model)


def analyze_model(
    model: ModelLike,
    *,
    eval_model: str | os.PathLike | onnx.ModelProto | None = None,
    dims: dict[str, int] | None = None,
) -> ModelAnalysis:
    """Load ``model`` and analyse it. ``dims`` binds symbolic dimensions (``{"batch": 8}``).

    ``eval_model`` supplies scope metadata the training graph lost; by default the
    ``eval_model.onnx`` beside the training graph is used when there is one.
    Raises :class:`~onnx_remat.errors.RematError` for unreadable or forward-only graphs.
    """
    source = as_loaded(model)
    if source is None:
        assert isinstance(model, onnx.ModelProto)
        proto = model
        check_loadable(proto)
    else:
        proto = source.model
    check_dim_names(proto, dims, str(source.path) if source is not None else "the model")
    if eval_model is None and source is not None and source.eval_model_path is not None:
        eval_model = source.eval_model_path
    eval_proto = None
    if eval_model is not None:
        eval_proto = (
            eval_model if isinstance(eval_model, onnx.ModelProto) else load_model(eval_model, check=False).model
        )
        # Only its scope names are read, but those must be text (onnxruntime never loads it here).
        check_text(eval_proto, eval_model if not isinstance(eval_model, onnx.ModelProto) else "eval model")
    try:
        tg = analyze(ModelGraph(proto))
    except ForwardOnlyGraph:
        path = source.path if source is not None else None
        where = f"{path}: a" if path is not None else "this is a"
        raise ForwardOnlyGraph(f"{where} forward-only graph (no gradient nodes): {forward_only_hint(path)}") from None
    tree = resolve_scopes(tg, eval_proto)
    sizes = TensorSizes(proto, dims)
    return ModelAnalysis(model=proto, source=source, graph=tg, scopes=tree, sizes=sizes)
