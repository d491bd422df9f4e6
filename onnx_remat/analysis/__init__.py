"""Analysis passes: what onnx-remat knows about a training graph before it changes anything.

:func:`analyze_model` loads a model and runs them: the forward/backward split (:mod:`.regions`),
the scope tree (:mod:`.scopes`) and tensor sizes (:mod:`.sizes`); :mod:`.scope_table` adds
per-scope figures. Nothing here changes the graph.
"""

from onnx_remat.analysis.model import ModelAnalysis, ModelLike, analyze_model

__all__ = ["ModelAnalysis", "ModelLike", "analyze_model"]
