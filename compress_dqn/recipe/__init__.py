"""The recipe: its schema (every key and its meaning), the guarded YAML reader, and the `compress` presets.

Nothing here imports TensorFlow: `validate` and `--help` stay fast.
"""
