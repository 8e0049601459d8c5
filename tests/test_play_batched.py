"""A TFLite policy's episodes side by side (evaluation/play.py): one interpreter call per step at a
batch of episodes gives every episode the return it gets alone, for every kind of file a run writes;
and benchmarks/eval_throughput.py runs at its smoke size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from compress_dqn.deploy.litert.policy import TFLitePolicy
from compress_dqn.envs.environment import make_env_from, reset_episode
from compress_dqn.envs.episodes import run_episodes
from compress_dqn.evaluation.play import evaluate, play_policy, play_unit
from compress_dqn.recipe.schema import EnvConfig

from conftest import ROOT

pytestmark = pytest.mark.slow

BREAKOUT = EnvConfig(id="MinAtar/Breakout-v1", max_episode_steps=10000)


def visited_states(env: EnvConfig, seeds: range) -> np.ndarray:
    """Observations of uniform-random episodes on `seeds`."""
    instance, rng, states = make_env_from(env, whole_games=True), np.random.default_rng(0), []
    n = instance.action_space.n
    for seed in seeds:
        obs, done = reset_episode(instance, seed), False
        while not done:
            states.append(obs)
            obs, _, terminated, truncated, _ = instance.step(int(rng.integers(n)))
            done = terminated or truncated
    return np.stack(states)


def _every_row_alone(run_dir: Path, env: EnvConfig) -> list[str]:
    """Bit for bit, at every batch size up to 70 and a few beyond: XNNPACK's batched kernels (and
    the reference kernels of int16x8-like files) compute a row as they compute it alone."""
    checked = []
    states = visited_states(env, range(40))[:300]
    for path in sorted(run_dir.glob("**/policy.tflite")):
        policy = TFLitePolicy(path)
        alone = np.stack([policy.q_values(state[None])[0] for state in states])
        actions = np.array([policy.act(state) for state in states])
        for n in [*range(2, 71), 128, 256]:
            for first in range(0, len(states) - n + 1, max(n, 37)):
                rows = slice(first, first + n)
                assert np.array_equal(policy.q_values(states[rows]), alone[rows]), (path, n)
                assert np.array_equal(policy.actions(states[rows]), actions[rows]), (path, n)
        checked.append(path.parent.name)
    return sorted(checked)


FILES = ["baseline", "ptq-int8", "qat-int8", "ptq-dynamic", "ptq-float16"]


def test_every_row_of_a_batch_is_what_the_file_computes_for_it_alone_cnn(minatar_variants_run):
    assert _every_row_alone(minatar_variants_run, BREAKOUT) == sorted([*FILES, "prune-90-int8"])


def test_every_row_of_a_batch_is_what_the_file_computes_for_it_alone_mlp(tiny_variants_run):
    assert _every_row_alone(tiny_variants_run, EnvConfig(id="CartPole-v1")) == sorted([*FILES, "student-qat"])


def _side_by_side(run_dir: Path, env: EnvConfig) -> None:
    seeds = range(25)
    for path in sorted(run_dir.glob("**/policy.tflite")):
        policy = TFLitePolicy(path)
        alone = [run_episodes(policy.act, env, [seed])[0] for seed in seeds]
        assert play_policy(policy, env, seeds, width=6) == alone, path
        assert play_policy(policy, env, seeds[:9], width=4) + play_policy(policy, env, seeds[9:]) == alone, path
        assert run_episodes(policy.act, env, seeds) == alone, path
        assert evaluate(policy, env, len(seeds), 0).episodes == alone == play_unit(env, str(path), 0, 0, len(seeds))


def test_side_by_side_returns_are_each_episodes_return_alone_for_every_file_cnn(minatar_variants_run):
    _side_by_side(minatar_variants_run, BREAKOUT)


def test_side_by_side_returns_are_each_episodes_return_alone_for_every_file_mlp(tiny_variants_run):
    _side_by_side(tiny_variants_run, EnvConfig(id="CartPole-v1"))


def test_the_throughput_benchmark_runs_at_its_smoke_size(minatar_variants_run):
    policy = minatar_variants_run / "baseline" / "policy.tflite"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "eval_throughput.py"), "--smoke", "--policy", str(policy)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    *runs, summary = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert [run["player"] for run in runs] == ["side_by_side", "one_at_a_time"]
    assert summary["episodes"] == 6 and all(summary["identical"].values())
    assert summary["players"]["side_by_side"]["episodes_per_s"] > 0 and summary["speedup_vs_one_at_a_time"] > 0
    for breakdown in (summary["breakdown_side_by_side"], summary["breakdown_one_at_a_time"]):
        assert breakdown["steps"] == summary["steps"] > 0
        seconds = breakdown["seconds"]
        assert seconds["environment"] > 0 and seconds["invoke"] > 0 and seconds["python"] > 0
        assert seconds["environment"] + seconds["interpreter"] + seconds["python"] == pytest.approx(seconds["total"], abs=2e-4)
