"""An RL Zoo-style SB3 Atari DQN through compress-dqn: the same returns as SB3's own play, and a ptq-int8 verdict.

    .venv/bin/python benchmarks/atari_zoo.py --out runs/atari-zoo
    .venv/bin/python benchmarks/atari_zoo.py --out runs/atari-zoo-smoke --smoke

Trains a Stable-Baselines3 CnnPolicy DQN briefly on SpaceInvadersNoFrameskip-v4 behind SB3's
make_atari_env + VecFrameStack(4) (nothing is downloaded) and saves it as dqn.zip. Plays it with
SB3's model.predict(obs, deterministic=True) on SB3's wrappers, episode i in a fresh environment
reset with seed i, and reads each whole game's return from SB3's Monitor, as the RL Zoo reports
it. Then runs, as a user would (the command line's own entry point, called in this process),

    compress-dqn compress dqn.zip --env SpaceInvadersNoFrameskip-v4 --variants ptq-int8 \\
        --episodes E --max-episodes E --set eval.tolerance=0.05

whose evaluation plays episode i with seed i too, and compares the baseline's returns episode by
episode. SB3's policy is also played on compress-dqn's own environment, which separates the
environment (must match exactly) from the port's numerics (float32 in TFLite vs torch: a near-tie
between two actions could flip). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

# SB3 logs nowhere here, but its logger imports torch.utils.tensorboard when it can, and TensorBoard then
# imports TensorFlow (~3 s) before training: nothing needs it then (compress imports its own later). A None
# entry makes that import fail, as where TensorBoard is not installed; SB3 then leaves its writer out.
sys.modules.setdefault("torch.utils.tensorboard", None)


def train(env_id: str, steps: int, out: Path, features_dim: int | None = None) -> Path:
    """SB3's DQN with the RL Zoo's Atari settings (dqn.yml's atari entry), its replay and learning start
    shrunk to a few thousand steps on a shared CPU; `features_dim` narrows NatureCNN's feature layer
    (SB3's default 512 when None)."""
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    torch.set_num_threads(1)
    env = VecFrameStack(make_atari_env(env_id, n_envs=1, seed=0), 4)
    model = DQN("CnnPolicy", env, buffer_size=min(steps, 10_000), learning_starts=min(100, steps // 5),
                learning_rate=1e-4, batch_size=32, train_freq=4, gradient_steps=1, target_update_interval=1_000,
                exploration_fraction=0.1, exploration_final_eps=0.01, optimize_memory_usage=True,
                replay_buffer_kwargs={"handle_timeout_termination": False}, seed=0, device="cpu",
                policy_kwargs={"features_extractor_kwargs": {"features_dim": features_dim}} if features_dim else None)
    model.learn(total_timesteps=steps)
    path = out / "dqn.zip"
    model.save(path)
    env.close()
    return path


def sb3_returns(path: Path, env_id: str, seeds: list[int]) -> list[float]:
    """SB3's own play: model.predict(deterministic=True) on SB3's wrappers; Monitor's whole-game returns."""
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    model = DQN.load(path, device="cpu")
    returns = []
    for seed in seeds:
        env = VecFrameStack(make_atari_env(env_id, n_envs=1, seed=seed), 4)
        obs = env.reset()
        while True:
            action, _ = model.predict(obs, deterministic=True)
            obs, _, _, infos = env.step(action)
            if "episode" in infos[0]:
                returns.append(float(infos[0]["episode"]["r"]))
                break
        env.close()
    return returns


def sb3_policy_on_our_env(path: Path, env_id: str, seeds: list[int]) -> list[float]:
    """SB3's model.predict on compress-dqn's environment (channel-last stacks, transposed as SB3 does)."""
    from stable_baselines3 import DQN

    from compress_dqn.envs.episodes import run_episodes
    from compress_dqn.recipe.schema import EnvConfig

    model = DQN.load(path, device="cpu")

    def act(obs: np.ndarray) -> int:
        return int(model.predict(np.transpose(obs, (2, 0, 1))[None], deterministic=True)[0][0])

    return run_episodes(act, EnvConfig(id=env_id, frame_stack=4), seeds)


def compress(path: Path, env_id: str, episodes: int, rollout_steps: int, overrides: list[str], out: Path) -> dict:
    """`compress-dqn compress` as a user runs it, through the command line's entry point in this process
    (one interpreter, one TensorFlow start); its results.json."""
    from compress_dqn.cli import run_in_process

    command = ["compress", str(path), "--env", env_id, "--variants", "ptq-int8",
               "--episodes", str(episodes), "--max-episodes", str(episodes), "--rollout-steps", str(rollout_steps),
               "--out", str(out), "--quiet"]
    for override in overrides:
        command += ["--set", override]
    run_in_process(command)  # its JSON line goes to stderr: stdout is this script's line alone
    return json.loads((out / "results.json").read_text())


SMOKE_FEATURES = 32
"""--smoke: NatureCNN's feature layer, 32 units instead of SB3's 512 (1.6M of the policy's 1.7M weights): the
same layers and port at a tenth of the bytes, which the measuring stage's TFLite Micro and C figures
walk byte by byte (~35 s of the smoke at 512)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--env", default="SpaceInvadersNoFrameskip-v4")
    parser.add_argument("--train-steps", type=int, default=5_000)
    parser.add_argument("--episodes", type=int, default=10, help="evaluation episodes, seeds 0..E-1")
    parser.add_argument("--rollout-steps", type=int, default=2_000, help="compress-dqn's calibration rollout")
    parser.add_argument("--tolerance", type=float, default=0.05, help="eval.tolerance of the verdict")
    parser.add_argument("--smoke", action="store_true",
                        help=f"300 training steps, NatureCNN's feature layer {SMOKE_FEATURES} units wide (not 512), "
                             "1 episode, 1 held-out episode, no SavedModel memory probe, no C or TFLM arena figures: checks the script runs")
    args = parser.parse_args()
    overrides = [f"eval.tolerance={args.tolerance}"]
    features_dim = SMOKE_FEATURES if args.smoke else None
    if args.smoke:
        args.train_steps, args.episodes, args.rollout_steps = 300, 1, 200
        # the script reads no memory, C or MCU figure: no TensorFlow memory probe, C cross-compile or TFLM arena search
        overrides += ["eval.heldout_episodes=1", "measure.saved_model_memory=none", "measure.c_policy=none",
                      "measure.micro=none"]
    out = Path(args.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    from compress_dqn.envs.environment import check_env_id

    check_env_id(args.env)  # registers ale-py's ids for SB3's gym.make
    seeds = list(range(args.episodes))
    clock = {"start": time.perf_counter()}
    path = train(args.env, args.train_steps, out, features_dim)
    clock["trained"] = time.perf_counter()
    reference = sb3_returns(path, args.env, seeds)
    on_ours = sb3_policy_on_our_env(path, args.env, seeds)
    clock["played"] = time.perf_counter()
    results = compress(path, args.env, args.episodes, args.rollout_steps, overrides, out / "run")
    clock["compressed"] = time.perf_counter()
    baseline, variant = results["variants"][0], results["variants"][1]
    port = results["train"].get("port_check") or {}
    print(json.dumps({
        "env_id": args.env, "train_steps": args.train_steps, "features_dim": features_dim or 512, "episodes": args.episodes, "seeds": seeds,
        "sb3_returns": reference, "sb3_policy_on_compress_dqn_env": on_ours,
        "compress_dqn_baseline_returns": baseline["return"]["episodes"],
        "env_equal": on_ours == reference, "baseline_equal": baseline["return"]["episodes"] == reference,
        "port_check": {k: port.get(k) for k in ("checked", "runtime", "max_abs_q_diff", "action_agreement")},
        "preprocessing": next((n for n in port.get("notes", []) if n.startswith("Atari preprocessing")), None),
        "ptq_int8": {"verdict": variant["return_vs_baseline"]["verdict"], "tolerance": results["eval"]["tolerance"],
                     "returns": variant["return"]["episodes"], "action_agreement": variant.get("action_agreement")},
        "seconds": {"train": round(clock["trained"] - clock["start"], 1),
                    "sb3_and_env_play": round(clock["played"] - clock["trained"], 1),
                    "compress": round(clock["compressed"] - clock["played"], 1)},
    }))


if __name__ == "__main__":
    main()
