"""Scheduling: the order onnxruntime runs a training graph in, and the gradient arithmetic around it.

* :mod:`~onnx_remat.scheduling.orders`: list schedulers that propose execution orders of the graph
  onnxruntime runs (:class:`~onnx_remat.ortsim.graph.RuntimeGraph`), and the DEFAULT order a node
  list with re-ranked leaves gives;
* :mod:`~onnx_remat.scheduling.realize`: write a chosen order into the node list (leaf placement);
* :mod:`~onnx_remat.scheduling.accumulate`: partial gradients of one parameter accumulated in place;
* :mod:`~onnx_remat.scheduling.schedule`: the pass that ties them together, checked by the
  estimate, and :func:`~onnx_remat.scheduling.schedule.schedule` (``onnx-remat schedule``).
"""
