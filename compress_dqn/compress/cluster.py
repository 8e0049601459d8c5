"""Weight clustering with tfmot: each kernel keeps `clusters` shared values after strip.

Clustering alone does not shrink the fp32 file; it makes the weights compress well (gzip) and
composes with cluster-preserving QAT."""

from __future__ import annotations

import numpy as np
import tensorflow_model_optimization as tfmot

from compress_dqn._tf import tf_keras
from compress_dqn.compress.prune import check_layer_names
from compress_dqn.rl.networks import WEIGHT_LAYERS, independent_copy, weight_layers
from compress_dqn.recipe.schema import ClusterConfig

_clustering = tfmot.clustering.keras
_INIT = {
    "kmeans_plus_plus": _clustering.CentroidInitialization.KMEANS_PLUS_PLUS,
    "linear": _clustering.CentroidInitialization.LINEAR,
    "density_based": _clustering.CentroidInitialization.DENSITY_BASED,
    "random": _clustering.CentroidInitialization.RANDOM,
}


def cluster_model(model: tf_keras.Model, cfg: ClusterConfig) -> tf_keras.Model:
    """A clustering-wrapped copy: every Dense and Conv2D layer not in cfg.exclude gets cluster_weights."""
    check_layer_names(model, cfg.exclude, "cluster.exclude")

    def wrap(layer: tf_keras.layers.Layer) -> tf_keras.layers.Layer:
        if isinstance(layer, WEIGHT_LAYERS) and layer.name not in cfg.exclude:
            return _clustering.cluster_weights(
                layer, number_of_clusters=cfg.clusters, cluster_centroids_init=_INIT[cfg.init]
            )
        return layer

    return tf_keras.models.clone_model(independent_copy(model), clone_function=wrap)


def strip(model: tf_keras.Model) -> tf_keras.Model:
    """Remove the clustering wrappers: plain layers holding the clustered weights."""
    return _clustering.strip_clustering(model)


def unique_kernel_values(model: tf_keras.Model) -> dict[str, int]:
    """Distinct values in each Dense/Conv2D kernel of a plain (stripped) model."""
    return {
        layer.name: int(len(np.unique(layer.kernel.numpy())))
        for layer in weight_layers(model)
    }
