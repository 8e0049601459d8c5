"""Every exported policy plays right where it is loaded the standard way: an outsider's LiteRT player
(tests/outsider_player.py, no compress-dqn) matches `compress-dqn evaluate` action for action."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner


PLAYER = Path(__file__).resolve().parent / "outsider_player.py"
EPISODES = 3


@pytest.fixture(scope="module")
def tiny_run(tiny_variants_run):
    return tiny_variants_run  # conftest's: ptq-int8, qat-int8, student-qat, ptq-dynamic, ptq-float16 and the baseline


def _our_actions(policy: Path) -> list[list[int]]:
    """The actions compress-dqn's own loader takes on the same episodes (what evaluate plays)."""
    from compress_dqn.convert.loading import load_policy
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
    assert {"ptq-int8", "qat-int8", "student-qat", "ptq-dynamic", "ptq-float16"} <= names and len(policies) == 6, names
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
