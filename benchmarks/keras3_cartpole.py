"""A DQN trained on CartPole in Keras 3 (as keras.io's examples write one), saved as .keras and .h5, then compressed.

    .venv/bin/python benchmarks/keras3_cartpole.py --out runs/keras3-cartpole
    .venv/bin/python benchmarks/keras3_cartpole.py --out /tmp/k3 --smoke

Trains a `keras.Sequential` Q-network (256x256, the RL Zoo's CartPole DQN settings: Adam 2.3e-3,
batch 64, a training phase of 128 gradient steps every 256 env steps from a fresh copy of the
target network, as SB3's 10-step copies during collection leave it, epsilon 1 -> 0.04 over the
first 16% of steps) with Keras 3's own optimizer on the TensorFlow backend, keeping the weights
that played best on evaluation episodes. Saves them with `model.save("q.keras")` and
`model.save("q.h5")`, then runs each through `compress-dqn compress` as a user would: the .keras
with a distilled int8 student (student-32x32-qat-int8) decided at a 1% tolerance, the .h5 with
dynamic-range quantization (ptq-dynamic). Prints one JSON line of training figures, one per file,
then a summary.

One run (seed 0, keras 3.15.1, 2 shared CPU cores): best evaluation return 330 after 50,000 steps
(286 s); both files ported with max |dQ| 0.0 and agreement 1.000 on 512 states; baseline 329.15 over
100 episodes; the student 500.0, decided "better" at 1%; ptq-dynamic on the .h5 322.01, "worse".
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

PORT_TOLERANCE = 1e-4


def q_network(hidden: list[int], lr: float):
    """The Keras 3 Q-network and its optimizer, as a Keras 3 user builds them."""
    import keras

    model = keras.Sequential([keras.Input((4,)), *[keras.layers.Dense(h, activation="relu") for h in hidden],
                              keras.layers.Dense(2)])
    return model, keras.optimizers.Adam(lr)


def _act(weights: list[np.ndarray], obs: np.ndarray) -> int:
    """Greedy action in numpy: a Keras call per env step costs far more than CartPole's step."""
    x = obs.astype(np.float32)
    for i in range(0, len(weights), 2):
        x = x @ weights[i] + weights[i + 1]
        if i + 2 < len(weights):
            x = np.maximum(x, 0.0)
    return int(np.argmax(x))


def evaluate(weights: list[np.ndarray], episodes: int, seed: int) -> float:
    import gymnasium as gym

    env, total = gym.make("CartPole-v1"), 0.0
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        done = False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(_act(weights, obs))
            total += float(reward)
            done = terminated or truncated
    env.close()
    return total / episodes


def train(steps: int, hidden: list[int], seed: int, eval_every: int, eval_episodes: int) -> tuple[object, dict]:
    """DQN in Keras 3: returns the model holding the best evaluated weights, and the training figures."""
    import gymnasium as gym
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    model, optimizer = q_network(hidden, 2.3e-3)
    target, _ = q_network(hidden, 2.3e-3)
    target.set_weights(model.get_weights())
    gamma, batch, learning_starts, train_freq, gradient_steps = 0.99, 64, 1000, 256, 128
    explore = max(1, int(0.16 * steps))

    @tf.function
    def update(obs, actions, rewards, next_obs, dones):
        next_q = tf.reduce_max(target(next_obs), axis=1)
        targets = rewards + gamma * (1.0 - dones) * next_q
        with tf.GradientTape() as tape:
            q = tf.gather(model(obs), actions, axis=1, batch_dims=1)
            loss = keras.losses.Huber()(targets, q)
        grads = tape.gradient(loss, model.trainable_variables)
        grads, _ = tf.clip_by_global_norm(grads, 10.0)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    rng = np.random.default_rng(seed)
    capacity = min(steps, 100_000)
    store = {"obs": np.zeros((capacity, 4), np.float32), "next": np.zeros((capacity, 4), np.float32),
             "action": np.zeros(capacity, np.int32), "reward": np.zeros(capacity, np.float32),
             "done": np.zeros(capacity, np.float32)}
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    weights, best, best_return, updates, start = model.get_weights(), None, -np.inf, 0, time.perf_counter()
    for step in range(steps):
        epsilon = max(0.04, 1.0 - 0.96 * step / explore)
        action = int(rng.integers(2)) if rng.random() < epsilon else _act(weights, obs)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        row = step % capacity
        for key, value in (("obs", obs), ("next", next_obs), ("action", action), ("reward", reward),
                           ("done", float(terminated))):
            store[key][row] = value
        obs = next_obs
        if terminated or truncated:
            obs, _ = env.reset()
        if step >= learning_starts and (step + 1) % train_freq == 0:
            # SB3 copies the target every 10 env steps while it collects, so a phase starts from a fresh copy.
            target.set_weights(model.get_weights())
            for _ in range(gradient_steps):
                idx = rng.integers(min(step + 1, capacity), size=batch)
                update(store["obs"][idx], store["action"][idx], store["reward"][idx], store["next"][idx], store["done"][idx])
                updates += 1
            weights = model.get_weights()
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            score = evaluate(weights, eval_episodes, 10_000 + step)
            if score >= best_return:
                best, best_return = [w.copy() for w in weights], score
    env.close()
    model.set_weights(best)
    return model, {"steps": steps, "gradient_steps": updates, "best_eval_return": best_return,
                   "train_seconds": round(time.perf_counter() - start, 1)}


def compress(path: Path, variants: str, episodes: int, max_episodes: int, rollout_steps: int, overrides: list[str],
             out: Path) -> tuple[list[str], dict]:
    """`compress-dqn compress` as a user runs it, through the command line's entry point in this process."""
    from compress_dqn.cli import run_in_process

    command = ["compress-dqn", "compress", str(path), "--env", "CartPole-v1", "--variants", variants,
               "--episodes", str(episodes), "--max-episodes", str(max_episodes), "--rollout-steps", str(rollout_steps),
               "--out", str(out), "--quiet"]
    for override in overrides:
        command += ["--set", override]
    run_in_process(command[1:])  # its JSON line goes to stderr: stdout is this script's lines alone
    return command, json.loads((out / "results.json").read_text())


def row(path: Path, command: list[str], results: dict, seconds: float) -> dict:
    port = results["train"].get("port_check") or {}
    baseline, *variants = results["variants"]
    return {
        "file": path.name, "command": " ".join(command),
        "port_check": {k: port.get(k) for k in ("checked", "format", "runtime", "states", "max_abs_q_diff",
                                                "action_agreement")},
        "ported": bool(port.get("checked")) and port.get("max_abs_q_diff") is not None
        and port["max_abs_q_diff"] <= PORT_TOLERANCE and port.get("action_agreement") == 1.0,
        "baseline": {"mean": baseline["return"]["mean"], "episodes": len(baseline["return"]["episodes"])},
        "variants": [{"name": v["name"], "mean": v["return"]["mean"], "episodes": len(v["return"]["episodes"]),
                      "verdict": v["return_vs_baseline"]["verdict"], "tolerance": v["return_vs_baseline"]["tolerance"]}
                     for v in variants],
        "seconds": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=50_000, help="DQN env steps in Keras 3")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variant", default="student-32x32-qat-int8", help="the compress preset the .keras file gets")
    parser.add_argument("--smoke", action="store_true", help="a 1,500-step 16-unit DQN, 2 episodes, students of 300 distillation and 100 QAT steps, best of 2")
    args = parser.parse_args()
    out = Path(args.out).absolute()
    out.mkdir(parents=True, exist_ok=True)

    import compress_dqn._tf  # noqa: F401  (tf_keras for compress-dqn, before Keras 3 is imported beside it)
    import keras

    hidden, eval_every, eval_episodes = [256, 256], 2_500, 10
    episodes, max_episodes, rollout_steps = 100, 1600, 20_000
    overrides: list[str] = []
    if args.smoke:
        args.steps, hidden, eval_every, eval_episodes = 1_500, [16], 1_500, 1
        episodes = max_episodes = 2
        rollout_steps = 300
        overrides = ["eval.heldout_episodes=1", "measure.saved_model_memory=none", "measure.c_policy=none",
                     "measure.micro=none"] + [f"variants.{args.variant}.{key}" for key in (
                         "fine_tune.steps=300", "fine_tune.select_interval=0", "fine_tune.student_states=0",
                         "quantize.qat_steps=100", "candidates.count=2", "candidates.episodes=2")]
    model, figures = train(args.steps, hidden, args.seed, eval_every, eval_episodes)
    figures.update({"summary": False, "keras_version": keras.__version__, "hidden": hidden})
    print(json.dumps(figures), flush=True)
    rows = []
    for suffix, variants in ((".keras", args.variant), (".h5", "ptq-dynamic")):
        path = out / f"q{suffix}"
        model.save(path)
        start = time.perf_counter()
        command, results = compress(path, variants, episodes, max_episodes, rollout_steps,
                                    [o for o in overrides if suffix == ".keras" or not o.startswith("variants.")],
                                    out / f"run{suffix.replace('.', '-')}")
        rows.append(row(path, command, results, time.perf_counter() - start))
        print(json.dumps(rows[-1]), flush=True)
    student = rows[0]["variants"][0]
    print(json.dumps({"summary": True, "files": len(rows), "ported": sum(r["ported"] for r in rows),
                      "worst_max_abs_q_diff": max((r["port_check"]["max_abs_q_diff"] or 0.0) for r in rows),
                      "baseline_mean": rows[0]["baseline"]["mean"], "student": student["name"],
                      "student_mean": student["mean"], "student_verdict": student["verdict"],
                      "tolerance": student["tolerance"]}))


if __name__ == "__main__":
    main()
