"""The TFLite toolkit every export target shares: a .tflite read, checked and decoded in one place."""
