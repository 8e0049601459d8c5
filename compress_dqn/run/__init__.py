"""Running a recipe: the run directory and its stages, variant builds, sequential looks, seeds, search, executors, the manifest.
"""
