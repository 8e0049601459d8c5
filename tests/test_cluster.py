import numpy as np

from compress_dqn.compress.build import build_variant
from compress_dqn.export.writers import export_saved_model

from conftest import variant


def test_clustered_layers_have_at_most_k_values_after_export(trained_tiny, tmp_path):
    recipe, result = trained_tiny
    v = variant(recipe, cluster={"clusters": 6, "exclude": ["q_values"]}, fine_tune={"steps": 100})
    built = build_variant(v, result.model, result.replay, recipe, result.info, quiet=True)
    uniques = built.details.unique_kernel_values
    assert uniques["hidden_0"] <= 6 and uniques["hidden_1"] <= 6
    assert uniques["advantage"] > 6 and uniques["value"] > 6  # the excluded output layer, as exported (split)
    from compress_dqn._tf import tf

    path = export_saved_model(built.export_model, (4,), np.float32, tmp_path / "sm")
    kernels = [w.numpy() for w in tf.saved_model.load(str(path)).weights if w.shape.rank == 2 and w.shape[1] == 32]
    assert kernels and all(len(np.unique(k)) <= 6 for k in kernels)
