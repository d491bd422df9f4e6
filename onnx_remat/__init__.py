"""onnx-remat: activation recomputation (rematerialization) for ONNX training graphs.

>>> import onnx_remat
>>> result = onnx_remat.apply("models/artifacts/blocks10", scopes=["Block"])
>>> result.save("blocks10_remat")
>>> onnx_remat.schedule("models/artifacts/gpt").save("gpt_scheduled")  # reorder only, no recompute

See README.md for the command line (``onnx-remat``), which is a thin layer over this package.

The names below are imported on first use (PEP 562), so that importing a submodule (the command
line's entry point, :mod:`onnx_remat.errors`) does not load onnx, numpy and graphsurgeon first:
the command line installs its signal handlers before those heavy imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"

from onnx_remat.errors import EnvironmentProblem, RegressionError, RematError, UsageError

if TYPE_CHECKING:
    from onnx_remat.analysis.model import ModelAnalysis, analyze_model
    from onnx_remat.remat.apply import apply, plan
    from onnx_remat.remat.result import ApplyResult
    from onnx_remat.scheduling.schedule import ScheduledModel, schedule

_LAZY = {
    "ModelAnalysis": "onnx_remat.analysis.model",
    "analyze_model": "onnx_remat.analysis.model",
    "ApplyResult": "onnx_remat.remat.result",
    "apply": "onnx_remat.remat.apply",
    "plan": "onnx_remat.remat.apply",
    "ScheduledModel": "onnx_remat.scheduling.schedule",
    "schedule": "onnx_remat.scheduling.schedule",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'onnx_remat' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "ApplyResult",
    "EnvironmentProblem",
    "ModelAnalysis",
    "RegressionError",
    "RematError",
    "ScheduledModel",
    "UsageError",
    "__version__",
    "analyze_model",
    "apply",
    "plan",
    "schedule",
]
