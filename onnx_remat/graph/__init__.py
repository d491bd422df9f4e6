"""The graph layer: ONNX <-> onnx-graphsurgeon without losing what graphsurgeon drops
(:mod:`.bridge`), the one topological sort (:mod:`.toposort`), the naming conventions of training
graphs (:mod:`.conventions`) and of the nodes onnx-remat adds (:mod:`.tags`), and the data-free
skeleton of a model that ONNX's checker and shape inference read (:mod:`.skeleton`)."""
