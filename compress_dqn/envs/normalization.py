"""A policy's per-feature input normalization, (obs - mean) / std, as one value: porting absorbs it
into weights, compression makes a model take it, exports carry it in the graph or as metadata, and
loaders apply it. Here, at the bottom of the packages, every one of them can name it. No TensorFlow."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class Normalization:
    """(obs - mean) / std per input feature: mean and std travel together, never swapped."""

    mean: np.ndarray
    std: np.ndarray

    def apply(self, observations: np.ndarray) -> np.ndarray:
        """Flattened observations normalized in float32, as a policy's caller computes them."""
        return (np.asarray(observations, np.float32).reshape(-1, self.mean.size) - self.mean) / self.std
