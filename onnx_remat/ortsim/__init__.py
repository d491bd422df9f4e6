"""What onnxruntime 1.19 does with a training graph before it runs it, emulated without a session.

Which ops it knows (:mod:`.registry`, from the generated :mod:`.ops_table`), the shapes of its
contrib and gradient ops (:mod:`.shapes`), its graph rewrites (:mod:`.optimizer`), which kernels
share buffers (:mod:`.kernels`), its execution order (:mod:`.order`) and its allocation planner and
memory pattern (:mod:`.planner`). :mod:`onnx_remat.estimate` drives them.
"""
