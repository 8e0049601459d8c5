"""What leaves the tool: SavedModel and TFLite export, the policy loaders, TFLite metadata, and TFLite Micro.
"""
