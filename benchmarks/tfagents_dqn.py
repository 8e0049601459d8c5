"""A TF-Agents DQN trained and saved as TF-Agents' docs say (PolicySaver), for compress-dqn to bring in.

tf-agents 0.19 pins TensorFlow 2.15, so it runs in a venv of its own, never the project's:

    python3 -m venv /work/venvs/tfagents
    /work/venvs/tfagents/bin/pip install 'tensorflow-cpu==2.15.*' 'tf-agents==0.19.*' \\
        'tensorflow-probability==0.23.0' 'numpy<2' 'gym==0.23.0'
    /work/venvs/tfagents/bin/python benchmarks/tfagents_dqn.py --out runs/tfagents --steps 15000
    /work/venvs/tfagents/bin/python benchmarks/tfagents_dqn.py --fixture tests/data/port/tfagents

The first trains a DqnAgent with QNetwork(fc_layer_params=(100, 50)) on CartPole-v1 (gym's, the
dynamics of gymnasium's) for --steps environment steps, plays its greedy policy for 20 episodes and
saves `PolicySaver(agent.policy).save(out/policy)`; then, in the project's venv,

    compress-dqn compress runs/tfagents/policy --env CartPole-v1 --variants student-32x32-qat-int8

brings it in (port check: agreement with the SavedModel's own `action` signature). The second
writes the small fixture tests/test_port_tfagents.py reads: an untrained QNetwork(fc_layer_params=(8,))
saved the same way, with CartPole states, the actions its `action` signature takes on them, and the
library versions, in expected.json. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def _env(seed: int):  # noqa: ANN202 - a tf-agents TFPyEnvironment
    from tf_agents.environments import suite_gym, tf_py_environment

    py_env = suite_gym.load("CartPole-v1")
    py_env.seed(seed)
    return tf_py_environment.TFPyEnvironment(py_env)


def agent_for(env, fc: tuple[int, ...], lr: float = 1e-3):  # noqa: ANN001, ANN201 - tf-agents objects
    """TF-Agents' DQN tutorial agent: a QNetwork of `fc` ReLU layers, Adam, TD loss, target updates."""
    import tensorflow as tf
    from tf_agents.agents.dqn import dqn_agent
    from tf_agents.networks import q_network
    from tf_agents.utils import common

    net = q_network.QNetwork(env.observation_spec(), env.action_spec(), fc_layer_params=fc)
    agent = dqn_agent.DqnAgent(env.time_step_spec(), env.action_spec(), q_network=net,
                               optimizer=tf.keras.optimizers.Adam(learning_rate=lr),
                               td_errors_loss_fn=common.element_wise_squared_loss,
                               target_update_period=100, epsilon_greedy=0.1, train_step_counter=tf.Variable(0))
    agent.initialize()
    return agent


def play(policy, episodes: int, seed: int) -> list[float]:  # noqa: ANN001 - a tf-agents policy
    """Greedy episode returns."""
    env = _env(seed)
    returns = []
    for _ in range(episodes):
        step, total = env.reset(), 0.0
        while not step.is_last():
            step = env.step(policy.action(step).action)
            total += float(step.reward.numpy()[0])
        returns.append(total)
    return returns


def train(out: Path, steps: int, seed: int) -> dict:
    """The tutorial's loop: one collect step, then one gradient step on a batch of 64 from the replay."""
    import tensorflow as tf
    from tf_agents.drivers import dynamic_step_driver
    from tf_agents.replay_buffers import tf_uniform_replay_buffer
    from tf_agents.utils import common

    tf.random.set_seed(seed)
    env = _env(seed)
    agent = agent_for(env, (100, 50))
    replay = tf_uniform_replay_buffer.TFUniformReplayBuffer(agent.collect_data_spec, batch_size=1, max_length=100_000)
    driver = dynamic_step_driver.DynamicStepDriver(env, agent.collect_policy, [replay.add_batch], num_steps=1)
    warm = dynamic_step_driver.DynamicStepDriver(env, agent.collect_policy, [replay.add_batch], num_steps=1000)
    warm.run()
    dataset = iter(replay.as_dataset(num_parallel_calls=1, sample_batch_size=64, num_steps=2).prefetch(2))
    agent.train = common.function(agent.train)
    step_fn = common.function(driver.run)
    start = time.perf_counter()
    for _ in range(steps):
        step_fn()
        experience, _ = next(dataset)
        agent.train(experience)
    seconds = time.perf_counter() - start
    returns = play(agent.policy, 20, seed + 1)
    from tf_agents.policies import policy_saver

    policy_saver.PolicySaver(agent.policy).save(str(out / "policy"))
    return {"steps": steps, "train_seconds": round(seconds, 1), "mean_return_20": float(np.mean(returns)),
            "saved": str(out / "policy")}


def cartpole_states(n: int, seed: int) -> np.ndarray:
    """States of random-action CartPole episodes (gym's CartPole-v1)."""
    import gym

    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    obs = env.reset(seed=seed)
    states = []
    while len(states) < n:
        states.append(np.asarray(obs, dtype=np.float32))
        obs, _, done, _ = env.step(int(rng.integers(2)))
        if done:
            obs = env.reset()
    return np.asarray(states, dtype=np.float32)


def saved_actions(policy_dir: Path, states: np.ndarray) -> np.ndarray:
    """The SavedModel's own `action` signature on `states` (a batch of MID time steps)."""
    import tensorflow as tf

    action = tf.saved_model.load(str(policy_dir)).signatures["action"]
    n = len(states)
    out = action(**{"0/step_type": tf.ones(n, tf.int32), "0/reward": tf.zeros(n), "0/discount": tf.ones(n),
                    "0/observation": tf.constant(states)})
    return out["action"].numpy()


def fixture(out: Path) -> dict:
    """An untrained 8-unit QNetwork, saved with PolicySaver, and the actions its SavedModel takes."""
    import tensorflow as tf
    import tf_agents
    from tf_agents.policies import policy_saver

    tf.random.set_seed(0)
    agent = agent_for(_env(0), (8,))
    policy_saver.PolicySaver(agent.policy).save(str(out))
    states = cartpole_states(64, 0)
    actions = saved_actions(out, states)
    expected = {"versions": {"tensorflow": tf.__version__, "tf_agents": tf_agents.__version__},
                "network": "QNetwork(fc_layer_params=(8,)), untrained (seed 0)",
                "states": states.tolist(), "actions": actions.tolist()}
    (out / "expected.json").write_text(json.dumps(expected))
    return {"fixture": str(out), "actions": int(len(actions)), "both_actions": len(set(actions.tolist())) == 2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/tfagents"))
    parser.add_argument("--steps", type=int, default=15_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fixture", type=Path, help="write the test fixture here instead of training")
    args = parser.parse_args()
    if args.fixture is not None:
        print(json.dumps(fixture(args.fixture)))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    print(json.dumps(train(args.out, args.steps, args.seed)))


if __name__ == "__main__":
    main()
