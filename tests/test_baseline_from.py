"""Bring your own baseline: a saved Keras Q-network compressed from the file alone."""

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from compress_dqn.cli import main
from compress_dqn.errors import UserError
from compress_dqn.recipe.schema import load_recipe

from conftest import IN_PROCESS, NO_TF_MEMORY, TINY

SMALL_VARIANTS = ("variants=[{name: ptq-int8, quantize: {mode: int8, calibration_samples: 100}}, "
                  "{name: prune-50, prune: {sparsity: 0.5, exclude: [q_values]}, fine_tune: {steps: 200}}, "
                  "{name: td-prune-50, prune: {sparsity: 0.5}, fine_tune: {method: td, steps: 200}}]")


@pytest.fixture(scope="module")
def saved_model_file(trained_tiny, tmp_path_factory):
    _, result = trained_tiny
    path = tmp_path_factory.mktemp("byo") / "q.keras"
    result.model.save(str(path))
    return path, result.model


@pytest.mark.slow
def test_recipe_from_a_keras_file_runs_the_whole_pipeline(saved_model_file, tmp_path):
    from compress_dqn.run.pipeline import run

    path, model = saved_model_file
    recipe = load_recipe(TINY, [f"baseline={{from: '{path}', rollout: {{steps: 600, epsilon: 0.1}}}}",
                                "eval.episodes=3", SMALL_VARIANTS, NO_TF_MEMORY])
    outcome = run(recipe, tmp_path / "run", quiet=True, log=lambda m: None)
    results = outcome.results.to_dict()
    source = results["train"]["source"]
    assert source["from"] == str(path) and source["data"]["kind"] == "rollout" and source["data"]["steps"] == 600
    assert len(source["sha256"]) == 64
    assert [v["name"] for v in results["variants"]] == ["baseline", "ptq-int8", "prune-50", "td-prune-50"]
    weights = np.load(tmp_path / "run" / "baseline" / "weights.npz")
    for saved, original in zip((weights[k] for k in sorted(weights.files)), model.get_weights()):
        np.testing.assert_array_equal(saved, original)  # the baseline is the file's network, untrained
    report = (tmp_path / "run" / "report.md").read_text()
    assert f"loaded from {path}" in report
    assert CliRunner().invoke(main, ["verify", str(tmp_path / "run")]).exit_code == 0


@pytest.mark.slow
def test_compress_shortcut_and_transitions_file(saved_model_file, tmp_path):
    path, model = saved_model_file
    # Transitions from a short greedy rollout, as a user might have logged them.
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    rows = {k: [] for k in ("observations", "actions", "rewards", "next_observations", "terminated", "truncated")}
    for _ in range(300):
        action = int(np.argmax(model(obs[None]).numpy()[0]))
        next_obs, reward, terminated, truncated, _ = env.step(action)
        for key, value in zip(rows, (obs, action, reward, next_obs, terminated, truncated)):
            rows[key].append(value)
        obs = env.reset()[0] if terminated or truncated else next_obs
    data = tmp_path / "transitions.npz"
    np.savez(data, **{k: np.asarray(v) for k, v in rows.items()})

    result = CliRunner().invoke(main, ["compress", str(path), "--env", "CartPole-v1", "--variants", "ptq-int8,prune-80",
                                       "--transitions", str(data), "--episodes", "3", "--max-episodes", "3",
                                       "--set", "variants.prune-80.fine_tune.steps=300", "--set", NO_TF_MEMORY,
                                       "--set", IN_PROCESS,
                                       "--out", str(tmp_path / "run"),
                                       "--quiet"])
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert [v["name"] for v in results["variants"]] == ["baseline", "ptq-int8", "prune-80"]
    assert results["train"]["source"]["data"] == {"kind": "transitions", "path": str(data), "transitions": 300}
    pruned = results["variants"][2]["compression"]
    assert pruned["prune"]["exclude"] == ["q_values", "hidden_0"]  # small input/output layers stay dense
    # The run directory's recipe reruns as is (and resumes: nothing left to do).
    rerun = CliRunner().invoke(main, ["run", str(tmp_path / "run" / "recipe.yaml"), "--out", str(tmp_path / "run"), "--quiet"])
    assert rerun.exit_code == 0, rerun.output


def test_mismatched_models_and_data_are_refused(saved_model_file, tmp_path):
    from compress_dqn.port.baseline import load_model, load_transitions
    from compress_dqn.envs.environment import env_info, make_env

    path, _ = saved_model_file
    lunar = env_info(make_env("LunarLander-v3"), "LunarLander-v3")
    with pytest.raises(UserError, match=r"input shape is \(4,\) but LunarLander-v3 observations are \(8,\); "
                                        r"its output shape is \(2,\) but LunarLander-v3 has 4 actions"):
        load_model(path, lunar)
    (tmp_path / "notes.txt").write_text("x")
    cartpole = env_info(make_env("CartPole-v1"), "CartPole-v1")
    for bad, fragment in [(tmp_path / "missing.keras", "no such file"), (tmp_path / "notes.txt", "expected a .keras or .h5"),
                          (tmp_path, r"a directory that is no compress-dqn run, no SavedModel \(no saved_model.pb\)")]:
        with pytest.raises(UserError, match=fragment):
            load_model(bad, cartpole)
    broken = tmp_path / "broken.keras"
    broken.write_bytes(path.read_bytes()[:300])
    with pytest.raises(UserError, match="not a zip-format .keras file"):
        load_model(broken, cartpole)

    good = {"observations": np.zeros((5, 4), np.float32), "actions": np.zeros(5, np.int64),
            "rewards": np.ones(5, np.float32), "next_observations": np.zeros((5, 4), np.float32),
            "terminated": np.zeros(5, bool), "truncated": np.zeros(5, bool)}
    cases = [
        ({"observations": np.zeros((5, 8), np.float32)}, r"observations has shape \(5, 8\), expected \(5, 4\)"),
        ({"actions": np.full(5, 7)}, r"actions range over \[7, 7\] but CartPole-v1 has actions 0..1"),
        ({"actions": np.zeros(5, np.float32)}, "actions have dtype float32; expected integers"),
        ({"rewards": np.full(5, np.nan)}, "rewards must be finite"),
        ({"observations": np.full((5, 4), np.nan, np.float32)}, "observations holds NaN or infinite values"),
        ({"terminated": np.full(5, 3)}, "terminated must be booleans"),
    ]
    for change, fragment in cases:
        np.savez(tmp_path / "t.npz", **{**good, **change})
        with pytest.raises(UserError, match=fragment):
            load_transitions(tmp_path / "t.npz", cartpole, 100, 0)
    np.savez(tmp_path / "t.npz", **{k: v for k, v in good.items() if k != "rewards"})
    with pytest.raises(UserError, match="missing arrays rewards"):
        load_transitions(tmp_path / "t.npz", cartpole, 100, 0)

    result = CliRunner().invoke(main, ["compress", str(path), "--env", "LunarLander-v3", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "input shape is (4,)" in result.output and not (tmp_path / "r").exists()
    result = CliRunner().invoke(main, ["compress", str(path), "--env", "CartPole-v1", "--variants", "ptq-int9"])
    assert result.exit_code == 2 and "unknown preset ptq-int9; choose from ptq-dynamic" in result.output


@pytest.mark.filterwarnings("ignore:You are saving your model as an HDF5 file")  # the .h5 is the point
def test_a_lambda_layer_is_refused_without_running_its_code(tmp_path, monkeypatch):
    """tf_keras applies safe_mode only to zip .keras files: an .h5 Lambda ran its stored code on load."""
    from compress_dqn._tf import tf_keras
    from compress_dqn.port.baseline import load_model
    from compress_dqn.envs.environment import env_info, make_env

    marker = tmp_path / "ran"
    monkeypatch.setenv("COMPRESS_DQN_TEST_MARKER", str(marker))
    inputs = tf_keras.Input((4,))
    touch = tf_keras.layers.Lambda(lambda t: (open(__import__("os").environ["COMPRESS_DQN_TEST_MARKER"], "w").close(), t)[1])
    model = tf_keras.Model(inputs, tf_keras.layers.Dense(2)(touch(inputs)))
    for name in ("q.h5", "q.keras"):
        model.save(str(tmp_path / name))
    (tmp_path / "h5-bytes.keras").write_bytes((tmp_path / "q.h5").read_bytes())
    marker.unlink()  # building the model called the Lambda once
    cartpole = env_info(make_env("CartPole-v1"), "CartPole-v1")
    for name, fragment in [("q.h5", "it has a Lambda layer"), ("q.keras", "it has a Lambda layer"),
                           ("h5-bytes.keras", "not a zip-format .keras file")]:
        with pytest.raises(UserError, match=fragment):
            load_model(tmp_path / name, cartpole)
        assert not marker.exists(), f"loading {name} ran the Lambda's code"


def test_a_missing_baseline_file_is_refused_before_anything_is_written(tmp_path):
    recipe = tmp_path / "byo.yaml"
    recipe.write_text("env: {id: CartPole-v1}\nbaseline: {from: nowhere.keras}\n")
    checked = CliRunner().invoke(main, ["validate", str(recipe)])
    assert checked.exit_code == 2 and "baseline.from:" in checked.output and "nowhere.keras: no such file" in checked.output
    ran = CliRunner().invoke(main, ["run", str(recipe), "--out", str(tmp_path / "run")])
    assert ran.exit_code == 2 and not (tmp_path / "run").exists()
    recipe.write_text(f"env: {{id: CartPole-v1}}\nbaseline: {{from: {recipe}, transitions: data.npz}}\n")
    checked = CliRunner().invoke(main, ["validate", str(recipe)])
    assert checked.exit_code == 2 and "baseline.transitions:" in checked.output and "data.npz" in checked.output


def test_loaded_frame_stacked_transitions_are_all_kept():
    """Unrelated stacked transitions take up to k + 1 rows each: none may be overwritten on load."""
    from types import SimpleNamespace

    from compress_dqn.port.baseline import load_transitions

    k, n = 4, 12
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, size=(n, 5, 5, k + 1)).astype(np.uint8)  # each transition its own history
    info = SimpleNamespace(obs_shape=(5, 5, k), obs_dtype=np.uint8, n_actions=3, frame_stack=k, env_id="Stacked")
    path = Path(tempfile.mkdtemp()) / "stacked.npz"
    np.savez(path, observations=frames[..., :k], next_observations=frames[..., 1:], actions=np.zeros(n, np.int64),
             rewards=np.ones(n, np.float32), terminated=np.zeros(n, bool), truncated=np.ones(n, bool))
    replay, summary = load_transitions(path, info, capacity=10_000, seed=0)
    assert summary.transitions == n and replay.num_transitions == n
    batch = replay.gather(np.flatnonzero(replay._flags[: replay.size] & 1))
    assert sorted(map(bytes, batch.observations)) == sorted(map(bytes, frames[..., :k]))


@pytest.mark.slow
def test_compress_an_sb3_zip_records_the_port_check(tmp_path):
    """A Stable-Baselines3 zip runs through `compress`; results.json and the report carry the port check."""
    from compress_dqn.evaluation.results import load_results

    path = Path(__file__).resolve().parent / "data" / "port" / "sb3_cartpole.zip"
    result = CliRunner().invoke(main, ["compress", str(path), "--env", "CartPole-v1", "--variants", "ptq-int8",
                                       "--rollout-steps", "400", "--episodes", "3", "--max-episodes", "3",
                                       "--set", NO_TF_MEMORY, "--out", str(tmp_path / "run"), "--quiet"])
    assert result.exit_code == 0, result.output
    check = load_results(tmp_path / "run" / "results.json").port_check
    assert check is not None and check.checked and check.states == 400
    assert check.max_abs_q_diff <= 1e-4 and check.action_agreement == 1.0
    assert "stable-baselines3" in check.runtime
    report = (tmp_path / "run" / "report.md").read_text()
    assert "Port from a Stable-Baselines3 DQN zip checked against stable-baselines3" in report
