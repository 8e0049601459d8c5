"""The pipeline with variants: same evaluation seeds for every variant, results.json shape, resume."""

import json

import compress_dqn.evaluate as evaluate_module
from compress_dqn.pipeline import run
from compress_dqn.recipe import load_recipe

from conftest import TINY

VARIANTS = ('variants=[{name: ptq-float16, quantize: {mode: float16}}, '
            '{name: student-8-int8, student: {net_arch: [8]}, quantize: {mode: int8, calibration_samples: 50}, '
            'fine_tune: {steps: 100}}]')


def test_variants_use_the_baselines_episode_seeds(tmp_path, monkeypatch):
    calls = []
    real = evaluate_module.evaluate

    def spy(act, env, episodes, seed):
        calls.append((env.id, episodes, seed))
        return real(act, env, episodes, seed)

    monkeypatch.setattr(evaluate_module, "evaluate", spy)
    recipe = load_recipe(TINY, [VARIANTS])
    outcome = run(recipe, tmp_path / "run", quiet=True, log=lambda m: None)
    assert calls == [("CartPole-v1", 5, 0)] * 3  # baseline + 2 variants, identical seeds

    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results == outcome.results
    names = [v["name"] for v in results["variants"]]
    assert names == ["baseline", "ptq-float16", "student-8-int8"]
    base, fp16, student = results["variants"]
    assert base["action_agreement"] == 1.0
    assert 0.0 <= student["action_agreement"] <= 1.0
    if fp16["action_agreement"] == 1.0:  # same actions on held-out states -> same episodes
        assert fp16["return"]["episodes"] == base["return"]["episodes"]
    assert student["size"]["params"] < base["size"]["params"]
    assert student["size"]["tflite_bytes"] < base["size"]["tflite_bytes"]
    assert student["compression"]["student"] == {"net_arch": [8], "activation": "relu", "conv": []}
    for v in results["variants"]:
        assert (tmp_path / "run" / v["artifacts"]["tflite"]).is_file()

    # Rerun: every stage is done, nothing is rebuilt.
    calls.clear()
    again = run(recipe, tmp_path / "run", quiet=True, log=lambda m: None)
    assert calls == [] and again.results == results


def test_a_smaller_tflite_encoding_is_kept_only_if_it_loads_and_matches(tmp_path):
    import numpy as np

    from compress_dqn.export import convert_tflite, export_saved_model
    from compress_dqn.networks import build_q_network
    from compress_dqn.pipeline import _same_policy

    obs = np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32)
    blobs = []
    for seed in (0, 1):
        from compress_dqn._tf import tf_keras

        tf_keras.utils.set_random_seed(seed)
        export_saved_model(build_q_network((4,), 2, [8]), (4,), np.float32, tmp_path / f"sm{seed}")
        blobs.append(convert_tflite(tmp_path / f"sm{seed}"))
    assert _same_policy(blobs[0], blobs[0], obs)
    assert not _same_policy(blobs[1], blobs[0], obs)  # loads, but another policy
    assert not _same_policy(blobs[0][:100], blobs[0], obs)  # does not load
    assert not list(tmp_path.glob(".check-*"))  # scratch files are cleaned up


def test_seeds_run_each_seed_and_aggregate_with_iqm(tmp_path):
    from compress_dqn.evaluate import iqm
    from compress_dqn.pipeline import run_seeds

    recipe = load_recipe(TINY, ["seeds=[0, 1]", "train.total_timesteps=300"])
    outcome = run_seeds(recipe, tmp_path / "run", quiet=True, log=lambda m: None)
    per_seed = [json.loads((tmp_path / "run" / f"seed-{s}" / "results.json").read_text()) for s in (0, 1)]
    assert [load_recipe(tmp_path / "run" / f"seed-{s}" / "recipe.yaml").seed for s in (0, 1)] == [0, 1]
    (baseline,) = outcome.results["aggregate"]
    means = [r["variants"][0]["return"]["mean"] for r in per_seed]
    assert baseline["per_seed_mean_return"] == means
    assert baseline["iqm_return"] == iqm(means)
    lo, hi = baseline["iqm_return_ci95"]
    assert lo <= baseline["iqm_return"] <= hi
    assert "IQM" in (tmp_path / "run" / "report.md").read_text()
    assert outcome.results["runs"] == ["seed-0/results.json", "seed-1/results.json"]
