"""Environments and greedy episodes: gymnasium, Atari and MinAtar preprocessing, seeding. No TensorFlow."""
