"""The LiteRT runtime: the policy loader every TFLite path plays through, and `export --target tflite`, the one file to ship for it."""
