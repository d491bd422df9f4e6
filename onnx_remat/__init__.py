"""onnx-remat: activation recomputation (rematerialization) for ONNX training graphs.

>>> import onnx_remat
>>> result = onnx_remat.apply("models/artifacts/blocks10", scopes=["Block"])
>>> result.save("blocks10_remat")
>>> onnx_remat.schedule("models/artifacts/gpt").save("gpt_scheduled")  # reorder only, no recompute

See README.md for the command line (``onnx-remat``), which is a thin layer over this package.
"""

__version__ = "0.1.0"

from onnx_remat.analysis.model import ModelAnalysis, analyze_model
from onnx_remat.errors import EnvironmentProblem, RegressionError, RematError, UsageError
from onnx_remat.remat.apply import ApplyResult, apply, plan
from onnx_remat.scheduling.schedule import ScheduledModel, schedule

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
