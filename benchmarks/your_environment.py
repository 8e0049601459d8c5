"""An SB3 DQN trained on a user's or a third-party environment, then compressed as a user would: `package:Id`.

    PYTHONPATH=tests .venv/bin/python benchmarks/your_environment.py --env envpkg.corridor:Corridor-v0 \\
        --kwargs '{"length": 6}' --max-episode-steps 30 --steps 8000 --out runs/your-env-corridor

Trains Stable-Baselines3's DQN (MlpPolicy, 64x64) for --steps on gymnasium.make(ID, **kwargs) with the time
limit, saves it as dqn.zip, and runs, through the command line's own entry point in this process,

    compress-dqn compress dqn.zip --env PACKAGE:ID --set env.kwargs.K=V ... --set env.max_episode_steps=N \\
        --variants ptq-int8,student-32x32-qat-int8 --set workers=2

so the variants are built on a pool of 2 workers that import the environment's module themselves. Prints one
JSON line: the port check (largest |dQ|, greedy-action agreement), each policy's return, size and verdict.
A third-party package installed outside the project's venv (pip install --target DIR) is found through
PYTHONPATH=DIR, in the workers too. Extra arguments after `--` go to `compress` (e.g. --episodes 50).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

# SB3's logger imports torch.utils.tensorboard when it can, which imports TensorFlow before training: nothing
# needs it then (compress imports its own later); a None entry leaves SB3's writer out.
sys.modules.setdefault("torch.utils.tensorboard", None)


def train(env_id: str, kwargs: dict, max_episode_steps: int | None, steps: int, out: Path, seed: int) -> Path:
    """SB3's DQN with small-problem settings (the RL Zoo's CartPole-like ones), saved as out/dqn.zip."""
    import gymnasium as gym
    from stable_baselines3 import DQN

    module, _, name = env_id.rpartition(":")
    if module:
        importlib.import_module(module)  # registers the id, as gymnasium.make would
    env = gym.make(name, max_episode_steps=max_episode_steps, **kwargs)
    model = DQN("MlpPolicy", env, learning_rate=1e-3, buffer_size=min(50_000, steps), learning_starts=min(1000, steps // 10),
                batch_size=64, train_freq=4, gradient_steps=1, target_update_interval=500, exploration_fraction=0.3,
                exploration_final_eps=0.05, policy_kwargs={"net_arch": [64, 64]}, seed=seed, device="cpu")
    model.learn(total_timesteps=steps)
    out.mkdir(parents=True, exist_ok=True)
    model.save(out / "dqn.zip")
    return out / "dqn.zip"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True, help="package.module:Id")
    parser.add_argument("--kwargs", default="{}", help="gymnasium.make's keyword arguments, as JSON")
    parser.add_argument("--max-episode-steps", type=int)
    parser.add_argument("--steps", type=int, default=20_000, help="SB3 training steps")
    parser.add_argument("--variants", default="ptq-int8,student-32x32-qat-int8")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true", help="300 SB3 steps, ptq-int8 alone, 2 episodes, nothing measured")
    args, extra = parser.parse_known_args()
    if args.smoke:
        args.steps, args.variants = 300, "ptq-int8"
        extra += ["--episodes", "2", "--max-episodes", "2", "--rollout-steps", "300"] + [
            a for s in ("eval.heldout_episodes=1", "measure.saved_model_memory=none", "measure.c_policy=none",
                        "measure.micro=none") for a in ("--set", s)]
    kwargs = json.loads(args.kwargs)
    started = time.perf_counter()
    zip_path = args.out / "dqn.zip"
    if not zip_path.is_file():
        train(args.env, kwargs, args.max_episode_steps, args.steps, args.out, args.seed)
    trained = time.perf_counter() - started
    from compress_dqn.cli import run_in_process

    sets = [f"env.kwargs.{key}={json.dumps(value)}" for key, value in kwargs.items()]
    if args.max_episode_steps:
        sets.append(f"env.max_episode_steps={args.max_episode_steps}")
    run_dir = args.out / "compressed"
    command = ["compress", str(zip_path), "--env", args.env, "--variants", args.variants, "--out", str(run_dir),
               "--quiet", "--set", "workers=2", *[a for s in sets for a in ("--set", s)],
               *[a for a in extra if a != "--"]]
    run_in_process(command)
    results = json.loads((run_dir / "results.json").read_text())
    check = results["train"].get("port_check") or {}
    print(json.dumps({
        "env": args.env, "kwargs": kwargs, "sb3_steps": args.steps, "train_seconds": round(trained, 1),
        "command": "compress-dqn " + " ".join(command[:1] + ["dqn.zip"] + command[2:]),
        "port_check": {k: check.get(k) for k in ("checked", "max_abs_q_diff", "action_agreement")},
        "policies": [{"name": v["name"], "return": v["return"]["mean"], "episodes": len(v["return"]["episodes"]),
                      "tflite_gzip_bytes": v["size"]["tflite_gzip_bytes"], "agreement": v.get("action_agreement"),
                      "verdict": (v.get("return_vs_baseline") or {}).get("verdict"),
                      "verdict_episodes": (v.get("return_vs_baseline") or {}).get("episodes")}
                     for v in results["variants"]],
    }))


if __name__ == "__main__":
    main()
