"""Running training graphs with onnxruntime-training and measuring them."""
