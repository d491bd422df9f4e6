"""onnxruntime's graph rewrites that change which tensors exist, one unit each (see :mod:`.base`).

Level 1: :mod:`.identity`, :mod:`.noop`, :mod:`.gemm` (rules), :mod:`.constants`, :mod:`.cse`,
:mod:`.transpose`; level 2: :mod:`.gemm`, :mod:`.matmul`. :mod:`onnx_remat.ortsim.optimizer`
runs them in onnxruntime's order.
"""
