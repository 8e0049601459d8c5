"""What leaves the tool, TensorFlow-free: one folder per runtime behind one registry of export targets.

registry.py lists the targets (litert/, micro/, c/, onnx/), each exporting through tflite/, the
TFLite format every target reads.
"""
