"""Everything onnx-remat knows about a training graph before it changes anything, in one object.

:func:`analyze_model` loads the model (a file, an artifacts directory, a :class:`LoadedModel` or an
``onnx.ModelProto``) and runs the analysis passes: forward/backward split
(:mod:`onnx_remat.analysis.regions`), scope tree (:mod:`onnx_remat.analysis.scopes`, with ``eval_model.onnx``
from beside the training graph when there is one) and tensor sizes (:mod:`onnx_remat.analysis.sizes`).
The commands ``apply``, ``scopes``, ``estimate`` and ``viz`` all start from it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import onnx
import onnx_graphsurgeon as gs

from onnx_remat import collector
from onnx_remat.analysis.regions import TrainingGraph, analyze, is_forward_only
from onnx_remat.analysis.scopes import ScopeTree, resolve_scopes
from onnx_remat.analysis.sizes import TensorSizes
from onnx_remat.errors import ForwardOnlyGraph
from onnx_remat.graph.bridge import ModelGraph
from onnx_remat.model_io import LoadedModel, check_dim_names, check_loadable, forward_only_hint, load_model
from onnx_remat.ortsim.registry import check_text

if TYPE_CHECKING:
    from onnx_remat.ortsim.emulation import Emulation

ModelLike = str | os.PathLike | LoadedModel | onnx.ModelProto


@dataclass
class ModelAnalysis:
    """A loaded training graph with its analyses.

    ``source`` is None when the model was given as a ModelProto. :attr:`graph` holds the
    graphsurgeon graph; a rewrite edits a copy of it (:meth:`~onnx_remat.analysis.regions.TrainingGraph.copy`), so one
    analysis serves any number of rewrites. :attr:`graph` and :attr:`scopes` are made by
    :func:`analyze_model`, or, with its ``defer_graph``, when first asked for.
    """

    model: onnx.ModelProto
    source: LoadedModel | None
    sizes: TensorSizes
    # Answers to queries on this analysis alone that a command asks more than once (the regions
    # and the scopes an estimate labels its steps with: a walk of every node), kept by the module
    # that asks, under the query's name. The analysis does not change, so neither do they.
    memo: dict[str, object] = field(default_factory=dict, repr=False, compare=False)
    _emulation: Emulation | None = field(default=None, repr=False, compare=False)
    _moved: set[str] | None = field(default=None, repr=False, compare=False)
    # the training graph and its scope tree; None until made (defer_graph), from the eval model's proto
    _training: tuple[TrainingGraph, ScopeTree] | None = field(default=None, repr=False, compare=False)
    _eval_proto: onnx.ModelProto | None = field(default=None, repr=False, compare=False)

    @property
    def graph(self) -> TrainingGraph:
        """The training graph: forward and backward regions, parameters, stashed activations
        (:func:`~onnx_remat.analysis.regions.analyze`)."""
        return self._analysed()[0]

    @property
    def scopes(self) -> ScopeTree:
        """The scope tree (:func:`~onnx_remat.analysis.scopes.resolve_scopes`)."""
        return self._analysed()[1]

    def _analysed(self) -> tuple[TrainingGraph, ScopeTree]:
        if self._training is None:
            self._training = _training_graph(self.model, self.source, self._eval_proto)
            self._eval_proto = None
        return self._training

    @property
    def input_names(self) -> list[str]:
        """The names of the graph's inputs, initializers left out (:attr:`graph`'s inputs), read
        off the model."""
        graph = self.model.graph
        initializers = {init.name for init in graph.initializer}
        return [vi.name for vi in graph.input if vi.name not in initializers]

    def emulation(self) -> Emulation:
        """The input graph as onnxruntime would run it (:func:`~onnx_remat.ortsim.emulation.emulate`),
        made at the first call and kept for the stages after it, until :meth:`take_emulation`."""
        if self._emulation is None:
            self._emulation = self._emulate()
        return self._emulation

    def take_emulation(self) -> Emulation:
        """:meth:`emulation`, no longer kept here: for the stage that reads it last, so that its
        memory goes with that stage's use of it."""
        emulation = self.emulation()
        self._emulation = None
        return emulation

    def moved_transposes(self, transposes: list[gs.Node]) -> set[str]:
        """The names of those of ``transposes`` (Transposes of :attr:`graph`) that onnxruntime's
        TransposeOptimizer moves or removes in the input graph. Read off :meth:`emulation` when it
        was made; otherwise the graph is emulated for it when there are any to ask about, and the
        emulation kept for the stage that takes it (:meth:`take_emulation`; one that will not,
        :meth:`release_emulation`), not made again there."""
        if not transposes:
            return set()
        if self._moved is None:
            self.emulation()
        assert self._moved is not None
        return {t.name for t in transposes if t.name in self._moved}

    def release_emulation(self) -> None:
        """Let go of the emulation held here, if any (:meth:`moved_transposes` made it): for a caller
        whose forked child took it, so that this process does not hold it too."""
        self._emulation = None

    def _emulate(self) -> Emulation:
        from onnx_remat.ortsim.emulation import emulate

        emulation = emulate(self.model, self.sizes)
        if self._moved is None:
            self._moved = _moved_transposes(self.model, emulation)
        return emulation

    @property
    def name(self) -> str:
        """How to call this model in messages: its path, or 'model'."""
        if self.source is None:
            return "model"
        return str(self.source.artifacts_dir or self.source.path)


def _moved_transposes(model: onnx.ModelProto, emulation: Emulation) -> set[str]:
    """The names of the model's Transposes that ``emulation`` does not run as written (moved or
    removed: :meth:`~onnx_remat.ortsim.emulation.Emulation.runs_as_written`), read off the model's
    nodes as the emulation read them (its ``io``), not off the graphsurgeon graph (which a
    command may never make: ``defer_graph``)."""
    protos = model.graph.node
    transposes = [j for j, p in enumerate(protos) if p.op_type == "Transpose" and not p.domain]
    if not transposes:
        return set()
    assert emulation.io is not None  # (emulate reads it first)
    inputs, outputs = emulation.io
    wanted = {o for j in transposes for o in outputs[j] if o}
    readers: dict[str, list[int]] = {}  # a Transpose's output -> its readers, once per input read
    for k, names in enumerate(inputs):
        for name in names:
            if name in wanted:
                readers.setdefault(name, []).append(k)
    moved = set()
    for j in transposes:
        name = protos[j].name
        read_by = [protos[k].name for o in outputs[j] if o for k in readers.get(o, [])]
        if not emulation.runs_as_written(name, list(inputs[j]), read_by):
            moved.add(name)
    return moved


def as_loaded(model: ModelLike) -> LoadedModel | None:
    """A :class:`LoadedModel` for paths and LoadedModels (onnxruntime's load check may still be
    pending: :meth:`LoadedModel.settle_load_check`); None for an in-memory ModelProto."""
    if isinstance(model, LoadedModel):
        return model
    if isinstance(model, onnx.ModelProto):
        return None
    return load_model(model, defer_load_check=True)


@contextmanager
def runtime_judged(source: LoadedModel | ModelAnalysis | None, *, at_end: bool = True) -> Iterator[None]:
    """Run a block while onnxruntime's load check of ``source``'s model may still run in a child,
    then settle it: onnxruntime judges what a valid graph is, so its refusal is what the block
    raises, whatever the block met on the way. ``at_end=False`` settles it only when the block
    raises (the caller settles it later). An interrupt stops the check. Nothing happens for a
    check that was settled already or never started."""
    loaded = source.source if isinstance(source, ModelAnalysis) else source
    try:
        yield
    except KeyboardInterrupt:
        if loaded is not None:
            loaded.cancel_load_check()
        raise
    except BaseException:
        if loaded is not None:
            loaded.settle_load_check()
        raise
    if at_end and loaded is not None:
        loaded.settle_load_check()


@collector.pauses
def analyze_model(
    model: ModelLike,
    *,
    eval_model: str | os.PathLike | onnx.ModelProto | None = None,
    dims: dict[str, int] | None = None,
    defer_load_check: bool = False,
    defer_graph: bool = False,
) -> ModelAnalysis:
    """Load ``model`` and analyse it. ``dims`` binds symbolic dimensions (``{"batch": 8}``).

    ``eval_model`` supplies scope metadata the training graph lost; by default the
    ``eval_model.onnx`` beside the training graph is used when there is one.
    Raises :class:`~onnx_remat.errors.RematError` for unreadable or forward-only graphs, and for
    graphs onnxruntime refuses to load. onnxruntime's load of a model file runs beside the
    analysis, in a child process where that saves time; with ``defer_load_check`` it may still
    run when this returns, and the caller settles it (a :func:`runtime_judged` block) before
    returning anything. With ``defer_graph`` the graphsurgeon graph, its regions and its scopes
    (2-3 s at 10^5 nodes) are made when first asked for (:attr:`ModelAnalysis.graph`), for a
    command that may not need them (``schedule`` needs the model and its sizes); a forward-only
    graph is refused now all the same (:func:`~onnx_remat.analysis.regions.is_forward_only`),
    what else the regions refuse only then.
    """
    source = as_loaded(model)
    with runtime_judged(source, at_end=not defer_load_check):
        return _analyze(model, source, eval_model, dims, defer_graph)


def _analyze(
    model: ModelLike,
    source: LoadedModel | None,
    eval_model: str | os.PathLike | onnx.ModelProto | None,
    dims: dict[str, int] | None,
    defer_graph: bool = False,
) -> ModelAnalysis:
    """:func:`analyze_model` once the model is read."""
    checking = source is not None and source.checking
    if source is None:
        assert isinstance(model, onnx.ModelProto)
        proto = model
        inferred = check_loadable(proto).inferred
    else:
        proto = source.model
        # the load check's typed skeleton, unless the check still runs beside (taken below)
        inferred = source.take_inferred() if not checking else None
    check_dim_names(proto, dims, str(source.path) if source is not None else "the model")
    sizes: TensorSizes | None = None
    if not checking:
        # The load check's inference, not a second one; first, so its typed skeleton (the whole
        # graph's nodes again) is let go before the graph is imported.
        sizes = TensorSizes(proto, dims, inferred=inferred)
        del inferred
    if eval_model is None and source is not None and source.eval_model_path is not None:
        eval_model = source.eval_model_path
    eval_proto = None
    if eval_model is not None:
        eval_proto = (
            eval_model if isinstance(eval_model, onnx.ModelProto) else load_model(eval_model, check=False).model
        )
        # Only its scope names are read, but those must be text (onnxruntime never loads it here).
        check_text(eval_proto, eval_model if not isinstance(eval_model, onnx.ModelProto) else "eval model")
    training = None
    if not defer_graph:
        training = _training_graph(proto, source, eval_proto)
    elif is_forward_only(proto):
        raise _forward_only(source)
    if sizes is None and defer_graph:
        # The check runs in a forked child (a large graph: onnx_remat.forked_check), and nothing
        # is imported or analysed beside it: the sizes are inferred here rather than taken from its
        # typed skeleton when it is done (the same types, strict or not: 1.6 s against 3.1 s at
        # 10^5 nodes). Its verdict is settled where the caller's runtime_judged block ends.
        sizes = TensorSizes(proto, dims)
    elif sizes is None:
        # The check ran in a forked child while the graph was imported and analysed (a large graph:
        # onnx_remat.forked_check); its verdict now, and its typed skeleton. A refusal is raised
        # here, and one that would have come first overrides what the analysis met (runtime_judged).
        assert source is not None
        sizes = TensorSizes(proto, dims, inferred=source.take_inferred())
    return ModelAnalysis(
        model=proto, source=source, sizes=sizes, _training=training, _eval_proto=eval_proto if defer_graph else None
    )


def _training_graph(
    proto: onnx.ModelProto, source: LoadedModel | None, eval_proto: onnx.ModelProto | None
) -> tuple[TrainingGraph, ScopeTree]:
    """The training graph of ``proto`` and its scope tree (with ``eval_proto``'s scope metadata)."""
    try:
        tg = analyze(ModelGraph(proto))
    except ForwardOnlyGraph:
        raise _forward_only(source) from None
    return tg, resolve_scopes(tg, eval_proto)


def _forward_only(source: LoadedModel | None) -> ForwardOnlyGraph:
    """The refusal of a forward-only graph, naming the training graph to give instead."""
    path = source.path if source is not None else None
    where = f"{path}: a" if path is not None else "this is a"
    return ForwardOnlyGraph(f"{where} forward-only graph (no gradient nodes): {forward_only_hint(path)}")
