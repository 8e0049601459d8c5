"""The run store: a run directory's paths (one owner), stages.json and its typed records. No TensorFlow."""
