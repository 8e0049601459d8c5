"""Every exported policy plays right where it is loaded the standard way: an outsider's LiteRT player
(tests/outsider_player.py, no compress-dqn) matches `compress-dqn evaluate` action for action."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import TINY

PLAYER = Path(__file__).resolve().parent / "outsider_player.py"
# Each way a policy reaches its file: normalized post-training int8, QAT behind its normalization,
# a distilled QAT student, dynamic range and float16 (float inputs), and the fp32 baseline.
VARIANTS = ("variants=[{name: ptq-int8, quantize: {mode: int8, calibration_samples: 100}}, "
            "{name: qat-int8, quantize: {mode: qat, qat_steps: 30}, fine_tune: {steps: 30}}, "
            "{name: student-qat, student: {net_arch: [8]}, quantize: {mode: qat, qat_steps: 30}, fine_tune: {steps: 60}}, "
            "{name: ptq-dynamic, quantize: {mode: dynamic}}]")
EPISODES = 3


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from compress_dqn.recipe.schema import load_recipe
    from compress_dqn.run.pipeline import run

    out = tmp_path_factory.mktemp("outsider") / "run"
    recipe = load_recipe(TINY, ["eval.episodes=3", "train.total_timesteps=600", VARIANTS])
    run(recipe, out, quiet=True, log=lambda m: None)
    return out


def _our_actions(policy: Path) -> list[list[int]]:
    """The actions compress-dqn's own loader takes on the same episodes (what evaluate plays)."""
    from compress_dqn.export.loading import load_policy
    from compress_dqn.envs.episodes import run_episodes
    from compress_dqn.recipe.schema import EnvConfig

    loaded, episodes = load_policy(policy), []
    for seed in range(EPISODES):
        taken: list[int] = []

        def act(obs, taken=taken):
            taken.append(loaded.act(obs))
            return taken[-1]

        run_episodes(act, EnvConfig(id="CartPole-v1"), [seed])
        episodes.append(taken)
    return episodes


@pytest.mark.slow
def test_an_outsiders_litert_player_matches_evaluate_on_every_variant(tiny_run):
    from compress_dqn.cli import main

    policies = sorted(tiny_run.glob("*/**/policy.tflite"))
    names = {p.parent.name for p in policies}
    assert {"ptq-int8", "qat-int8", "student-qat", "ptq-dynamic"} <= names and len(policies) == 5, names
    for policy in policies:
        done = subprocess.run([sys.executable, str(PLAYER), str(policy), "CartPole-v1", "0", str(EPISODES)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        outsider = json.loads(done.stdout)
        result = CliRunner().invoke(main, ["evaluate", str(policy), "--env", "CartPole-v1", "--episodes", str(EPISODES)])
        assert result.exit_code == 0, result.output
        assert outsider["returns"] == json.loads(result.stdout)["return"]["episodes"], policy.parent.name
        assert outsider["actions"] == _our_actions(policy), policy.parent.name


def test_the_outsider_player_imports_nothing_of_compress_dqn():
    source = PLAYER.read_text()
    assert "compress_dqn" not in source.split('"""', 2)[2]  # the code, past its docstring
