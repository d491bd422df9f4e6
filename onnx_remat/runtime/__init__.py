"""Running training graphs with onnxruntime-training and measuring them.

* ``onnx_remat.runtime.measure.measure(model, ...) -> Measurement``: planned, arena and live
  memory peaks, step time, loss, and what onnxruntime kept of a recompute rewrite;
* ``onnx_remat.runtime.compare.compare(a, b, ...) -> Comparison``: two graphs side by side with
  B/A ratios, and whether their loss and gradients are equal.

The functions are not re-exported here: they would hide the submodules of the same name
(``import onnx_remat.runtime.measure`` must stay the module). onnxruntime is imported only inside
the worker processes (:mod:`.worker`), never by importing this package.
"""
