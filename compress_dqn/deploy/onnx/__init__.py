"""`export --target onnx`: a .tflite policy as ONNX, and the PyTorch interpreter of exactly the exported ops."""
