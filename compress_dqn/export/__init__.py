"""What needs TensorFlow to leave the tool: SavedModel and TFLite writers, the SavedModel runtime, GPU figures."""
