"""SB3's Atari preprocessing (envs/atari.py) against SB3's own make_atari_env + VecFrameStack, frame by frame.

An RL Zoo agent must see the frames it was trained on, so compress-dqn's environment is compared
with SB3's wrappers (a test extra) on the same seed and the same random actions: every observation,
every clipped reward and episode end of the training view, and every whole game's return as SB3's
Monitor counts it, across lost lives and game overs.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from compress_dqn.envs.atari import AtariSettings
from compress_dqn.envs.environment import check_env_id, env_info, make_env
from compress_dqn.errors import UserError
from compress_dqn.recipe.schema import AtariConfig, EnvConfig
from compress_dqn.replay.buffer import ReplayBuffer

pytest.importorskip("ale_py")
pytest.importorskip("cv2")


def _sb3_env(env_id: str, seed: int, **env_kwargs):
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    check_env_id(env_id)  # registers ale-py's ids, as importing ale_py does for SB3 users
    return VecFrameStack(make_atari_env(env_id, n_envs=1, seed=seed, env_kwargs=env_kwargs or None), 4)


def _compare(env_id: str, steps: int, seed: int = 0, **env_kwargs) -> dict[str, int]:
    """Play SB3's env and both views of ours on the same actions; assert equality at every step."""
    pytest.importorskip("stable_baselines3")
    reference = _sb3_env(env_id, seed, **env_kwargs)
    expected = reference.reset()[0]
    ours = [make_env(env_id, env_kwargs, atari=AtariConfig(preprocessing="sb3"), frame_stack=4, whole_games=whole)
            for whole in (False, True)]
    observations = [env.reset(seed=seed)[0] for env in ours]
    rng = np.random.default_rng(seed)
    counts, game_return = {"lives_lost": 0, "games": 0}, 0.0
    for step in range(steps):
        for obs in observations:
            assert obs.shape == (84, 84, 4) and np.array_equal(obs, expected), f"{env_id}: step {step} differs"
        action = int(rng.integers(ours[0].action_space.n))
        frames, rewards, dones, infos = reference.step([action])
        expected = frames[0]
        obs, reward, terminated, truncated, _ = ours[0].step(action)  # training view: SB3's own episodes
        assert (reward, terminated or truncated) == (rewards[0], dones[0]), f"{env_id}: step {step}"
        observations[0] = ours[0].reset()[0] if terminated or truncated else obs
        obs, reward, terminated, truncated, _ = ours[1].step(action)  # whole games, the game's own rewards
        game_return += reward
        episode = infos[0].get("episode")
        assert (terminated or truncated) == (episode is not None), f"{env_id}: step {step}"
        if episode is not None:
            assert game_return == episode["r"], f"{env_id}: a game's return differs from SB3 Monitor's"
            counts["games"] += 1
            game_return, obs = 0.0, ours[1].reset()[0]
        elif dones[0]:
            counts["lives_lost"] += 1
        observations[1] = obs
    for env in ours:
        env.close()
    reference.close()
    return counts


@pytest.mark.parametrize("env_id, lives", [("BreakoutNoFrameskip-v4", True), ("PongNoFrameskip-v4", False),
                                           ("SpaceInvadersNoFrameskip-v4", True)])
def test_observations_equal_sb3_for_1000_steps(env_id, lives):
    counts = _compare(env_id, 1000)
    assert counts["games"] >= 1  # across a game over, into the next game
    assert (counts["lives_lost"] > 0) == lives


def test_ale_v5_ids_take_sb3_preprocessing_with_their_own_settings():
    """ALE/...-v5 keeps its sticky actions; the wrapper skips frames, so the game is made with frameskip 1."""
    counts = _compare("ALE/Breakout-v5", 300, seed=3, frameskip=1)
    assert counts["lives_lost"] > 0


def test_sb3_preprocessing_is_the_default_for_zoo_ids_only():
    zoo = make_env("PongNoFrameskip-v4", frame_stack=4)
    info = env_info(zoo, "PongNoFrameskip-v4")
    assert info.atari == "sb3" and info.frame_stack == 4 and info.obs_shape == (84, 84, 4)
    first = zoo.reset(seed=0)[0]
    assert not first[..., :3].any() and first[..., 3].any()  # SB3's stack starts from zeros
    ale = make_env("ALE/Pong-v5", frame_stack=4)
    assert env_info(ale, "ALE/Pong-v5").atari == "gymnasium"
    chosen = make_env("ALE/Pong-v5", frame_stack=4, atari=AtariConfig(preprocessing="sb3"))
    assert env_info(chosen, "ALE/Pong-v5").atari == "sb3"
    gym_pong = make_env("PongNoFrameskip-v4", frame_stack=4, atari=AtariConfig(preprocessing="gymnasium"))
    assert not np.array_equal(gym_pong.reset(seed=0)[0], first)  # the comparison above has teeth
    for env in (zoo, ale, chosen, gym_pong):
        env.close()


def test_recipes_take_the_key_for_atari_ids_only():
    assert EnvConfig(id="BreakoutNoFrameskip-v4", atari={"preprocessing": "sb3"}).atari.preprocessing == "sb3"
    assert EnvConfig(id="ALE/Breakout-v5", atari={"preprocessing": "sb3"}).atari.terminal_on_life_loss is None
    with pytest.raises(ValueError, match="Atari ids only"):
        EnvConfig(id="CartPole-v1", atari={"preprocessing": "sb3"})
    with pytest.raises(ValueError, match="always grayscale"):
        EnvConfig(id="BreakoutNoFrameskip-v4", atari={"preprocessing": "sb3", "grayscale_obs": False})
    check_env_id("SpaceInvadersNoFrameskip-v4")  # registered once ale-py is imported
    with pytest.raises(UserError, match="did you mean"):
        check_env_id("BreakoutNoFrameskip-v5")


def _key(*arrays: np.ndarray) -> str:
    return hashlib.sha1(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)).hexdigest()


def test_replay_stores_stacks_from_zeros_exactly():
    """The replay rebuilds stacks padding with their first frame; SB3's zero padding is stored as frames."""
    env = make_env("BreakoutNoFrameskip-v4", frame_stack=4)
    replay = ReplayBuffer(2000, (84, 84, 4), np.uint8, 4, seed=0, frame_stack=4)
    rng, seen = np.random.default_rng(0), {}
    obs = env.reset(seed=0)[0]
    for _ in range(400):
        action = int(rng.integers(4))
        next_obs, reward, terminated, truncated, _ = env.step(action)
        replay.add(obs, action, reward, next_obs, terminated, truncated)
        seen[_key(obs, np.int64(action), next_obs)] = (reward, terminated)
        obs = env.reset()[0] if terminated or truncated else next_obs
    batch = replay.gather(replay.sample_indices(1000))
    starts = 0
    for i in range(1000):
        key = _key(batch.observations[i], batch.actions[i], batch.next_observations[i])
        assert seen[key] == (batch.rewards[i], bool(batch.terminated[i]))
        starts += not batch.observations[i][..., 0].any()
    assert starts > 0 and set(batch.rewards) <= {0.0, 1.0}  # reset stacks sampled; rewards clipped
    env.close()


@pytest.fixture(scope="module")
def zoo_zip(tmp_path_factory):
    """An untrained SB3 CnnPolicy DQN saved as the RL Zoo saves one (weights do not matter here)."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    check_env_id("BreakoutNoFrameskip-v4")
    env = VecFrameStack(make_atari_env("BreakoutNoFrameskip-v4", n_envs=1, seed=0), 4)
    model = DQN("CnnPolicy", env, buffer_size=100, learning_starts=10, seed=0, device="cpu")
    path = tmp_path_factory.mktemp("zoo") / "dqn.zip"
    model.save(path)
    env.close()
    return path


def test_a_zoo_zip_picks_sb3_preprocessing_and_refuses_what_cannot_be_matched(zoo_zip):
    from compress_dqn.port.sb3 import SB3Policy, atari_env, atari_shape

    path = zoo_zip
    data = path.read_bytes()
    env = atari_env(path, data, "BreakoutNoFrameskip-v4")
    assert env == EnvConfig(id="BreakoutNoFrameskip-v4", frame_stack=4,
                            atari=AtariConfig(preprocessing="sb3", noop_max=30, frame_skip=4, screen_size=84,
                                              terminal_on_life_loss=True))
    assert atari_env(path, data, "CartPole-v1") is None
    net = SB3Policy(path, data).ported((84, 84, 4), "sb3")
    assert any("SB3's AtariWrapper" in note and "bare zip" in note for note in net.notes)
    with pytest.raises(UserError, match=r"set env.atari: \{preprocessing: sb3\}"):
        SB3Policy(path, data).ported((84, 84, 4), "gymnasium")
    with pytest.raises(UserError, match="set env.frame_stack: 4"):
        SB3Policy(path, data).ported((84, 84), "sb3")
    config = path.parent / path.stem / "config.yml"
    config.parent.mkdir()
    config.write_text("!!python/object/apply:collections.OrderedDict\n- - - env_wrapper\n"
                      "    - - stable_baselines3.common.atari_wrappers.AtariWrapper:\n"
                      "          terminal_on_life_loss: false\n  - - frame_stack\n    - 4\n"
                      "  - - policy\n    - CnnPolicy\n")
    assert atari_env(path, data, "BreakoutNoFrameskip-v4").atari.terminal_on_life_loss is False
    played = env_info(make_env("BreakoutNoFrameskip-v4", frame_stack=4), "BreakoutNoFrameskip-v4").atari_settings
    assert played == AtariSettings(noop_max=30, frame_skip=4, screen_size=84, terminal_on_life_loss=True)
    with pytest.raises(UserError, match="terminal_on_life_loss False .*set env.atari.terminal_on_life_loss: False"):
        SB3Policy(path, data).ported((84, 84, 4), "sb3", played)
    config.write_text("env_wrapper:\n  - gymnasium.wrappers.AtariPreprocessing\n")
    with pytest.raises(UserError, match="names env_wrapper gymnasium.wrappers.AtariPreprocessing") as caught:
        atari_env(path, data, "BreakoutNoFrameskip-v4")
    assert "\n" not in str(caught.value)
    config.unlink()
    policy = SB3Policy(path, data)
    for shape in ((3, 210, 160), (1, 84, 84), (4, 64, 64)):
        policy.obs_shape = shape
        with pytest.raises(UserError, match=rf"shape \({shape[0]}, {shape[1]}, {shape[2]}\).*cannot be matched"):
            atari_shape(policy, AtariSettings(screen_size=84))
