"""The onnx-remat command line (installed as onnx_remat.cli)."""
