"""Magnitude pruning: sparsity reached during the fine-tune, preserved through strip and export."""

import numpy as np
import pytest

from compress_dqn.compress.build import build_variant
from compress_dqn.compress.prune import kernel_sparsity
from compress_dqn.errors import UserError
from compress_dqn.convert.conversion import export_saved_model

from conftest import variant


@pytest.mark.parametrize("schedule", ["polynomial", "constant"])
def test_target_sparsity_reached_and_output_layer_kept_dense(trained_tiny, schedule, tmp_path):
    recipe, result = trained_tiny
    v = variant(recipe, prune={"sparsity": 0.8, "schedule": schedule, "frequency": 10, "exclude": ["q_values"]},
                fine_tune={"steps": 200})
    built = build_variant(v, result.model, result.replay, recipe, result.info, quiet=True)
    sparsity = built.details.sparsity
    assert abs(sparsity["hidden_0"] - 0.8) <= 0.01 and abs(sparsity["hidden_1"] - 0.8) <= 0.01
    # Measured on what is exported: the output layer is split into advantage and value heads.
    assert set(sparsity) == {"hidden_0", "hidden_1", "advantage", "value"}
    assert sparsity["advantage"] < 0.5  # excluded
    assert built.nonzero_params < 0.5 * built.params
    # The baseline was copied, not pruned in place.
    assert kernel_sparsity(result.model)["hidden_0"] < 0.1
    # Exported weights keep the zeros.
    path = export_saved_model(built.export_model, (4,), np.float32, tmp_path / "sm")
    from compress_dqn._tf import tf

    loaded = tf.saved_model.load(str(path))
    kernels = [v.numpy() for v in loaded.weights if v.shape.rank == 2 and v.shape[1] == 32]
    assert kernels and all(abs((k == 0).mean() - 0.8) <= 0.01 for k in kernels)


def test_unknown_excluded_layer_is_a_clear_error(trained_tiny):
    recipe, result = trained_tiny
    v = variant(recipe, prune={"sparsity": 0.5, "exclude": ["output"]}, fine_tune={"steps": 10})
    with pytest.raises(UserError, match="prune.exclude: no Dense or Conv2D layer named output; layers are hidden_0"):
        build_variant(v, result.model, result.replay, recipe, result.info, quiet=True)


def test_td_fine_tune_prunes_too(trained_tiny):
    recipe, result = trained_tiny
    v = variant(recipe, prune={"sparsity": 0.5, "frequency": 5}, fine_tune={"method": "td", "steps": 300})
    built = build_variant(v, result.model, result.replay, recipe, result.info, quiet=True)
    assert built.details.fine_tune.method == "td"
    assert all(abs(built.details.sparsity[name] - 0.5) <= 0.01 for name in ("hidden_0", "hidden_1"))


def test_short_fine_tunes_still_reach_the_target():
    """tfmot prunes only every `frequency` steps: the schedule must end on one of them."""
    from compress_dqn.compress.prune import schedule
    from compress_dqn.recipe.schema import PruneConfig

    for total in (10, 48, 83, 6000, 6010):
        plan = schedule(PruneConfig(sparsity=0.9, frequency=50), total).get_config()["config"]
        assert (plan["end_step"] - plan["begin_step"]) % plan["frequency"] == 0
        assert 0 < plan["end_step"] <= max(1, int(0.6 * total))


def test_reported_sparsity_is_the_exported_kernels(trained_tiny):
    """With the output layer pruned too, the advantage head re-centres its kernel (W - mean W), so
    its zeros are not the pruned layer's: the figures must come from the exported model."""
    from compress_dqn.compress.build import dense_kernels

    recipe, result = trained_tiny
    v = variant(recipe, prune={"sparsity": 0.8, "frequency": 10}, fine_tune={"steps": 200})
    built = build_variant(v, result.model, result.replay, recipe, result.info, quiet=True)
    exported = {name: float((k == 0).mean()) for name, k in dense_kernels(built.export_model).items()}
    assert built.details.sparsity == pytest.approx(exported)
    assert "q_values" not in built.details.sparsity  # the pruned layer is not what ships


@pytest.mark.parametrize("method", ["distill", "td"])
def test_a_fused_phase_prunes_exactly_as_one_step_per_call(trained_tiny, method):
    """Pruning wrappers count their own steps inside each training call, so a phase of K steps run
    as one fused call prunes the same weights as K calls (what fit() does), to float rounding:
    the TD update's fused graph may sum in another order (1 ulp seen)."""
    from compress_dqn._tf import set_seed
    from compress_dqn.compress.recovery import fine_tune
    from compress_dqn.compress.prune import prune_model, strip, update_pruning_step
    from compress_dqn.recipe.schema import PruneConfig
    from compress_dqn.replay.buffer import ReplayBuffer

    class OneStepPerCall(type(update_pruning_step())):
        def _implements_train_batch_hooks(self) -> bool:  # asks the loop for one call per step
            return True

    recipe, result = trained_tiny
    ft = variant(recipe, prune={"sparsity": 0.7}, fine_tune={"method": method, "steps": 300}).fine_tune
    weights = []
    for callback in (update_pruning_step(), OneStepPerCall()):
        set_seed(0)
        replay = ReplayBuffer(result.replay.capacity, result.info.obs_shape, result.info.obs_dtype,
                              result.info.n_actions, seed=0)
        replay.load_state_dict(result.replay.state_dict())
        wrapped = prune_model(result.model, PruneConfig(sparsity=0.7, frequency=10), 150)
        fine_tune(wrapped, ft, recipe, result.model, replay, (callback,), wrapped=True, quiet=True)
        weights.append(strip(wrapped).get_weights())
        assert kernel_sparsity(strip(wrapped))["hidden_1"] == pytest.approx(0.7, abs=0.01)
    for fused, stepped in zip(*weights):
        np.testing.assert_array_equal(fused == 0, stepped == 0)
        np.testing.assert_allclose(fused, stepped, rtol=1e-6, atol=1e-7)


def test_variants_with_one_pruning_share_it_and_get_the_model_each_would_get_alone(trained_tiny, tmp_path, monkeypatch):
    """A pruning equal to one already built in the run (same pruning, fine-tune and baseline) is
    loaded, not recomputed; and the variant that loads it gets exactly the weights it gets when
    it prunes alone, so a variant's bytes do not depend on which build ran first."""
    import copy

    from compress_dqn.compress import prune

    recipe, result = trained_tiny
    calls = []
    real = prune.prune_model
    monkeypatch.setattr(prune, "prune_model", lambda *a, **k: calls.append(1) or real(*a, **k))

    def build(name, shared, steps=100, quantize="dynamic"):
        # The student's states (DAgger) make the fine-tune depend on its seed: the key's, not the name's.
        v = variant(recipe, name=name, prune={"sparsity": 0.5},
                    fine_tune={"steps": steps, "learning_rate": 1e-3, "student_states": 50, "student_states_interval": 40},
                    quantize={"mode": quantize, "calibration_samples": 50})
        # a fresh replay each time, as each build unit loads its own (sampling draws from its generator)
        return build_variant(v, result.model, copy.deepcopy(result.replay), recipe, result.info, quiet=True,
                             shared=shared)

    first = build("p50-dynamic", tmp_path / "run")
    second = build("p50-int8", tmp_path / "run", quantize="int8")
    assert len(calls) == 1
    assert second.details.fine_tune.shared == first.details.fine_tune.shared
    assert second.details.fine_tune.gradient_steps == 100
    alone = build("p50-int8", tmp_path / "alone", quantize="int8")
    assert len(calls) == 2
    for built in (first, alone):
        assert all(np.array_equal(a, b) for a, b in zip(second.export_model.get_weights(), built.export_model.get_weights()))
    # What follows the pruning draws the same replay samples after a load as after pruning (int8 calibration).
    assert np.array_equal(second.calibration, alone.calibration)
    build("p50-longer", tmp_path / "run", steps=120)  # another fine-tune: its own pruning
    assert len(calls) == 3
    assert len(list((tmp_path / "run").glob("prune-*.npz"))) == 2
    assert not list((tmp_path / "run").glob(".tmp-*"))


def test_a_td_fine_tune_or_a_pruned_student_does_not_share_its_pruning(trained_tiny, tmp_path):
    """A TD fine-tune adds transitions to the replay buffer that later stages sample, and a pruned
    student starts from its own weights: neither pruning may be loaded by another variant."""
    recipe, result = trained_tiny
    for fields in ({"fine_tune": {"method": "td", "steps": 60}},
                   {"student": {"net_arch": [8]}, "fine_tune": {"steps": 30}}):
        for name in ("a", "b"):
            built = build_variant(variant(recipe, name=name, prune={"sparsity": 0.5}, **fields), result.model,
                                  result.replay, recipe, result.info, quiet=True, shared=tmp_path)
            assert built.details.fine_tune.shared is None
    assert not list(tmp_path.iterdir())


def test_selection_keeps_only_fully_pruned_weights(trained_tiny, monkeypatch):
    """A pruning fine-tune with selection (select_interval) must hand back a model at the target
    sparsity even where its earlier, denser weights play better: here every evaluation scores
    lower than the one before, so without the guard the unpruned start would be kept. And the
    kept snapshot, taken after a gradient step, is masked again before the wrappers go."""
    import compress_dqn.rl.callbacks as evaluate
    from compress_dqn.compress.prune import pruned_from_step

    scores = iter(range(1000, 0, -1))
    monkeypatch.setattr(evaluate, "run_episodes", lambda act, env, seeds: [next(scores)] * len(seeds))
    monkeypatch.setattr(evaluate, "run_episodes_side_by_side", lambda q, env, seeds: [next(scores)] * len(seeds))
    recipe, result = trained_tiny
    v = variant(recipe, prune={"sparsity": 0.8, "frequency": 10, "exclude": ["q_values"]},
                fine_tune={"steps": 400, "select_interval": 50, "select_episodes": 2})
    built = build_variant(v, result.model, result.replay, recipe, result.info, quiet=True)
    selection = built.details.fine_tune.selection
    assert selection.evaluations[0][0] >= pruned_from_step(v.prune, 400) > 200
    assert selection.selected_step == selection.evaluations[0][0] < 400  # the first eligible, not the last
    assert built.details.sparsity["hidden_0"] == pytest.approx(0.8, abs=0.01)
    assert built.details.sparsity["hidden_1"] == pytest.approx(0.8, abs=0.01)


def test_sparse_format_is_an_export_choice_that_keeps_the_shared_pruning(trained_tiny):
    """prune.sparse_format reaches the build's export choice (try_sparse_format: whether the exporter
    may keep TFLite's sparse format, which TFLite Micro cannot expand) and changes nothing upstream:
    both settings have the same shared-pruning key."""
    from compress_dqn.compress.build import pruning_key

    recipe, result = trained_tiny
    dense, sparse = (variant(recipe, prune={"sparsity": 0.5, "frequency": 5, "sparse_format": kept}, fine_tune={"steps": 10})
                     for kept in (False, True))
    assert pruning_key(dense, recipe, result.model) == pruning_key(sparse, recipe, result.model)
    assert not build_variant(dense, result.model, result.replay, recipe, result.info, quiet=True).try_sparse_format
    assert build_variant(sparse, result.model, result.replay, recipe, result.info, quiet=True).try_sparse_format
