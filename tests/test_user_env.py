"""A user's own environment (tests/envpkg/corridor.py, `envpkg.corridor:Corridor-v0`): imported the gymnasium
way in every process, its kwargs, time limit and wrappers applied before anything reads it, wrappers called only
when they are gymnasium.Wrapper subclasses, its 2 x length float table flattened, a worker that cannot import it
one line and a rerun that resumes.

Costs (CPU seconds): the environment tests well under one each (no TensorFlow); the SB3 zip test ~5 (torch, SB3,
the port's TensorFlow import where its worker has none yet); the pool and Ray test ~8 (two spawned workers that
import gymnasium only, a local Ray of 2); the run ~30 (300 steps, a failed start whose 2 pool workers import
TensorFlow, its resume in this process, evaluate and export)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from compress_dqn.envs.environment import make_env, make_env_from, probe_env
from compress_dqn.errors import UserError
from compress_dqn.recipe.schema import EnvConfig, env_from_data

TESTS = Path(__file__).resolve().parent
CORRIDOR = "envpkg.corridor:Corridor-v0"


@pytest.fixture(autouse=True)
def envpkg_importable(monkeypatch):
    """tests/ on sys.path, as a user's folder on PYTHONPATH; spawned workers get the same sys.path."""
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.delenv("CORRIDOR_ONLY_IN", raising=False)


def _time_limit(env) -> int | None:
    while env is not None:
        if type(env).__name__ == "TimeLimit":
            return env._max_episode_steps
        env = getattr(env, "env", None)
    return None


def test_a_package_id_imports_its_module_flattens_its_table_and_gets_a_time_limit():
    from compress_dqn.envs.user_env import DEFAULT_MAX_EPISODE_STEPS

    env = make_env(CORRIDOR, {"length": 6})
    assert env.observation_space.shape == (12,)  # 2 x 6, in C order as SB3's FlattenExtractor
    first, _ = env.reset(seed=0)
    assert first[6:].tolist() == [0, 0, 0, 0, 0, 1.0]  # row 1, the goal, after row 0
    assert _time_limit(env) == DEFAULT_MAX_EPISODE_STEPS  # registered without one
    assert _time_limit(make_env(CORRIDOR, max_episode_steps=30)) == 30
    assert probe_env(EnvConfig(id=CORRIDOR, kwargs={"length": 9})).obs_shape == (18,)
    wide = make_env(CORRIDOR, {"dtype": "float64"})  # as flappy-bird-gymnasium's: float32, as SB3's policies take it
    assert wide.observation_space.dtype == np.float32 and wide.reset(seed=0)[0].dtype == np.float32


def test_only_integer_pixels_take_the_image_presets_a_float_table_or_stack_is_flat():
    from compress_dqn.envs.environment import EnvInfo, is_image

    def info(shape, dtype, scale=None):
        return EnvInfo("x", shape, np.dtype(dtype), 2, input_scale=scale)

    assert not is_image(info((25,), "float32")) and not is_image(info((8, 4), "float32"))  # stacked vectors: flat
    assert is_image(info((84, 84, 4), "uint8", 1 / 255)) and is_image(info((10, 10, 4), "uint8", 1.0))


def test_a_module_that_cannot_be_imported_or_registers_no_id_is_one_line_naming_both():
    with pytest.raises(UserError, match=r"env.id: 'no_such_pkg71.envs:Foo-v0': cannot import module 'no_such_pkg71.envs'"
                                        r" .*PYTHONPATH"):
        make_env("no_such_pkg71.envs:Foo-v0")
    with pytest.raises(UserError, match=r"'envpkg:Nowhere-v0': module 'envpkg' was imported but registers no "
                                        r"environment 'Nowhere-v0'"):
        make_env("envpkg:Nowhere-v0")
    with pytest.raises(UserError, match=r"'envpkg.corridor:Corridor-v1': .*did you mean envpkg.corridor:Corridor-v0"):
        make_env("envpkg.corridor:Corridor-v1")


def test_wrappers_apply_in_order_and_anything_but_a_wrapper_class_is_refused_before_it_is_called(tmp_path):
    env = make_env_from(EnvConfig(id=CORRIDOR, wrappers=["envpkg.corridor.RewardScale",  # the RL Zoo's dotted form
                                                         {"class": "envpkg.corridor:RewardScale", "kwargs": {"scale": 3}}]))
    env.reset(seed=0)
    assert env.step(1)[1] == pytest.approx(-0.03)  # both applied: -0.01 x 1 x 3
    marker = tmp_path / "ran"
    for name, kwargs, kind in (("os:system", {"command": f"touch {marker}"}, "builtin_function_or_method"),
                               ("envpkg.corridor:touch", {"path": str(marker)}, "function"),
                               ("envpkg.corridor:Corridor", {}, "class envpkg.corridor.Corridor")):
        cfg = EnvConfig(id=CORRIDOR, wrappers=["envpkg.corridor:RewardScale", {"class": name, "kwargs": kwargs}])
        with pytest.raises(UserError, match=rf"env.wrappers: '{name}' is a {kind}, not a gymnasium.Wrapper subclass"):
            make_env_from(cfg)
    assert not marker.exists()  # nothing was called
    with pytest.raises(UserError, match=r"env.wrappers\[0\]: .*'os' is not package.module:Class"):
        env_from_data({"id": CORRIDOR}, ("env.wrappers=[os]",))


def test_dict_observations_are_refused_naming_the_wrapper_that_fixes_it():
    with pytest.raises(UserError, match=r"observation space Dict.*add env.wrappers: \[gymnasium.wrappers:FlattenObservation\]"):
        make_env(CORRIDOR, {"dict_obs": True})
    fixed = make_env(CORRIDOR, {"dict_obs": True}, wrappers=["gymnasium.wrappers:FlattenObservation"])
    assert fixed.observation_space.shape == (16,)


def test_an_sb3_agents_zoo_env_kwargs_and_wrapper_and_the_command_lines_env_settings_reach_the_probe(tmp_path):
    """compress/search read the environment before anything else: the RL Zoo's env_kwargs and env_wrapper for a
    non-Atari agent, the command line's --set env.* over them, a bare zip's settings from --set alone."""
    import gymnasium as gym
    from stable_baselines3 import DQN

    from compress_dqn.port.sb3 import SB3Policy
    from compress_dqn.run.model_recipe import model_env

    gym.make(CORRIDOR)  # registers it in this process for SB3
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    DQN("MlpPolicy", gym.make("Corridor-v0", length=6), learning_starts=0, device="cpu").save(zoo / "dqn.zip")
    bare = tmp_path / "dqn.zip"
    bare.write_bytes((zoo / "dqn.zip").read_bytes())
    (zoo / "config.yml").write_text(  # as the RL Zoo dumps its OrderedDict of hyperparameters
        "!!python/object/apply:collections.OrderedDict\n- - - env_kwargs\n    - {length: 6}\n"
        "  - - env_wrapper\n    - - envpkg.corridor.RewardScale: {scale: 2.0}\n")

    env = model_env(zoo / "dqn.zip", CORRIDOR, 1)
    assert env.kwargs == {"length": 6} and env.wrappers == [{"class": "envpkg.corridor.RewardScale", "kwargs": {"scale": 2.0}}]
    policy = SB3Policy(zoo / "dqn.zip", (zoo / "dqn.zip").read_bytes())
    assert policy.obs_shape == (2, 6) and policy.transposed_for(probe_env(env).obs_shape) is False  # flattened, as SB3
    assert model_env(zoo / "dqn.zip", CORRIDOR, 1, ("env.kwargs.length=5", "env.wrappers=[]")).kwargs == {"length": 5}

    assert model_env(bare, CORRIDOR, 1).kwargs == {}  # no Zoo files: the default 2 x 8 table
    with pytest.raises(UserError, match=r"SB3 saved observations of shape \(2, 6\), the environment gives \(16,\)"):
        policy.transposed_for(probe_env(model_env(bare, CORRIDOR, 1)).obs_shape)
    overridden = model_env(bare, CORRIDOR, 1, ("env.kwargs.length=6", "train.gamma=0.9"))  # env.* only, before the probe
    assert probe_env(overridden).obs_shape == (12,)


def test_pool_workers_and_ray_tasks_build_it_and_a_worker_that_cannot_import_it_is_one_line(monkeypatch):
    from compress_dqn.run.executors import map_units

    cfg = EnvConfig(id=CORRIDOR, kwargs={"length": 5}, wrappers=["envpkg.corridor:RewardScale"])
    probe_env(cfg)  # the main process imports it first, as a run does
    infos = map_units(probe_env, [(cfg,), (cfg,)], "local", workers=2)
    assert [i.obs_shape for i in infos] == [(10,), (10,)]
    monkeypatch.setenv("CORRIDOR_ONLY_IN", str(os.getpid()))  # workers spawned now cannot import it
    with pytest.raises(UserError, match=r"^env.id: 'envpkg.corridor:Corridor-v0': importing module 'envpkg.corridor' "
                                        r"failed \(ImportError: corridor: not importable"):
        map_units(probe_env, [(cfg,), (cfg,)], "local", workers=2)
    monkeypatch.delenv("CORRIDOR_ONLY_IN")
    pytest.importorskip("ray")
    # tests/ is on this process's sys.path only: Ray's tasks find it through the runtime_env the executor gives them
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                     if p and Path(p).resolve() != TESTS))
    assert [i.obs_shape for i in map_units(probe_env, [(cfg,), (cfg,)], "ray", workers=2)] == [(10,), (10,)]


def test_ray_tasks_get_the_modules_folder_here_and_the_package_itself_at_an_address():
    import sys

    from compress_dqn.envs.user_env import ray_runtime_env

    make_env(CORRIDOR)
    assert ray_runtime_env(remote=True) == {"py_modules": [sys.modules["envpkg"]]}  # its top-level package, shipped
    assert ray_runtime_env(remote=False)["env_vars"]["PYTHONPATH"].split(os.pathsep)[0] == str(TESTS)


def test_a_ray_tasks_user_error_reads_as_its_one_line_not_rays_traceback():
    ray = pytest.importorskip("ray")
    from compress_dqn.run.executors import _ray_result

    class Failed:
        exceptions = ray.exceptions

        @staticmethod
        def get(ref):
            raise ray.exceptions.RayTaskError("probe_env", "Traceback (most recent call last):\n  ...", UserError("env.x"))

    with pytest.raises(UserError) as raised:
        _ray_result(Failed, None)
    assert str(raised.value) == "env.x"


def test_validate_names_the_modules_building_the_environment_runs(tmp_path):
    from click.testing import CliRunner

    from compress_dqn.cli import main

    recipe = tmp_path / "corridor.yaml"
    recipe.write_text(yaml.safe_dump({"env": {"id": CORRIDOR, "wrappers": ["envpkg.corridor:RewardScale"]},
                                      "train": {"total_timesteps": 200, "learning_starts": 100}}))
    done = CliRunner().invoke(main, ["validate", str(recipe)])
    assert done.exit_code == 0, done.output
    assert f"ok: {recipe}: {CORRIDOR} (obs (16,) float32, 2 actions)" in done.output
    assert "note: building the environment imports envpkg.corridor, running its code" in done.output


RUN = {
    "name": "corridor", "seed": 0, "workers": 2,
    "env": {"id": CORRIDOR, "kwargs": {"length": 6}, "max_episode_steps": 30,
            "wrappers": [{"class": "envpkg.corridor:RewardScale", "kwargs": {"scale": 2.0}}]},
    "train": {"total_timesteps": 300, "net_arch": [16, 16], "batch_size": 32, "buffer_size": 1000, "learning_starts": 100,
              "target_update_interval": 50, "checkpoint_interval": 100, "intra_op_threads": 1},
    "eval": {"episodes": 3, "seed": 0},
    "measure": {"saved_model_memory": "none", "micro": "none", "c_policy": "none"},
    "variants": [{"name": "ptq-int8", "quantize": {"mode": "int8", "calibration_samples": 100}},
                 {"name": "student", "student": {"net_arch": [8]}, "quantize": {"mode": "qat", "qat_steps": 30},
                  "fine_tune": {"steps": 60}}],
}


@pytest.mark.slow
def test_a_run_whose_workers_cannot_import_the_module_stops_in_one_line_and_the_rerun_resumes_evaluates_and_exports(
        tmp_path, monkeypatch):
    """The start builds its two variants on a pool of 2 whose workers cannot import the module: one line, exit 2;
    the rerun (in this process: the pool's own import is test_pool_workers_...'s) keeps the trained baseline."""
    from click.testing import CliRunner

    from compress_dqn.cli import main

    recipe, out = tmp_path / "corridor.yaml", tmp_path / "run"
    recipe.write_text(yaml.safe_dump(RUN))
    monkeypatch.setenv("CORRIDOR_ONLY_IN", str(os.getpid()))  # the pool's workers cannot import the module
    failed = CliRunner().invoke(main, ["run", str(recipe), "--out", str(out), "--quiet"])
    assert failed.exit_code == 2 and "Traceback" not in failed.output, failed.output
    assert failed.output.strip().splitlines()[-1].startswith(
        f"error: env.id: '{CORRIDOR}': importing module 'envpkg.corridor' failed"), failed.output
    monkeypatch.delenv("CORRIDOR_ONLY_IN")
    done = CliRunner().invoke(main, ["run", str(recipe), "--out", str(out), "--set", "workers=1"])
    assert done.exit_code == 0, done.output
    assert "[baseline] trained" not in done.output  # resumed: the baseline the failed start trained
    results = json.loads((out / "results.json").read_text())
    assert results["env_id"] == CORRIDOR and [v["name"] for v in results["variants"]] == ["baseline", "ptq-int8", "student"]
    student = out / "variants" / "student" / "policy.tflite"
    played = CliRunner().invoke(main, ["evaluate", str(student), "--env", CORRIDOR, "--episodes", "2",
                                       "--set", "env.kwargs.length=6", "--set", "env.max_episode_steps=30"])
    assert played.exit_code == 0, played.output
    assert json.loads(played.output.strip().splitlines()[-1])["env_id"] == CORRIDOR
    exported = CliRunner().invoke(main, ["export", str(student), "--target", "onnx", "--out", str(tmp_path / "s.onnx")])
    assert exported.exit_code == 0 and (tmp_path / "s.onnx").is_file(), exported.output
