"""onnx-remat: activation recomputation for ONNX training graphs."""

__version__ = "0.1.0"
