"""The RL Zoo's published classic-control DQN and QR-DQN agents through `compress-dqn compress`: port check and returns.

    .venv/bin/python benchmarks/rl_zoo_agents.py --zoo /work/zoo --out runs/rl-zoo-agents
    .venv/bin/python benchmarks/rl_zoo_agents.py --out runs/rl-zoo-smoke --smoke

--zoo is a copy of github.com/DLR-RM/rl-trained-agents (at least dqn/ENV_1/ and qrdqn/ENV_1/ of the
four classic-control games, each zip with its ENV/config.yml and args.yml beside it). Each agent
runs as a user runs it, one after another (the command line's own entry point, called in this process):

    compress-dqn compress ALGO/ENV_1/ENV.zip --env ENV --variants ptq-int8 --episodes E --max-episodes E

(LunarLander-v2 is played on LunarLander-v3, gymnasium's id for it). Prints one JSON line per
agent: the SB3 release that saved the zip, the port check against SB3 / sb3-contrib, the baseline's
mean return beside the Zoo's benchmark.md figure, and ptq-int8's verdict; then a summary line.
--smoke writes one tiny untrained QR-DQN zip (nothing is downloaded) and runs it for 2 episodes,
without the SavedModel memory probes, the C flash figures and the TFLM arena search (no row reads them).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zipfile
from pathlib import Path

# SB3 logs nowhere here, but its logger imports torch.utils.tensorboard when it can, and TensorBoard then
# imports TensorFlow (~3 s) before the smoke's zip is written: nothing needs it then. A None
# entry makes that import fail, as where TensorBoard is not installed; SB3 then leaves its writer out.
sys.modules.setdefault("torch.utils.tensorboard", None)

ENVS = {"CartPole-v1": "CartPole-v1", "Acrobot-v1": "Acrobot-v1", "MountainCar-v0": "MountainCar-v0",
        "LunarLander-v2": "LunarLander-v3"}
"""The Zoo's env id -> the gymnasium id it is played on."""
ZOO_BENCHMARK = {  # rl-baselines3-zoo benchmark.md: mean_reward, std_reward
    ("dqn", "Acrobot-v1"): (-76.639, 11.752), ("dqn", "CartPole-v1"): (500.0, 0.0),
    ("dqn", "LunarLander-v2"): (154.382, 79.241), ("dqn", "MountainCar-v0"): (-100.849, 9.925),
    ("qrdqn", "Acrobot-v1"): (-69.135, 9.967), ("qrdqn", "CartPole-v1"): (500.0, 0.0),
    ("qrdqn", "LunarLander-v2"): (70.236, 225.491), ("qrdqn", "MountainCar-v0"): (-106.042, 15.536),
}
PORT_TOLERANCE = 1e-4


def smoke_zoo(root: Path) -> list[tuple[str, str]]:
    """A one-agent stand-in for rl-trained-agents: an untrained sb3-contrib QR-DQN on CartPole-v1."""
    import gymnasium as gym
    import torch
    from sb3_contrib import QRDQN

    torch.manual_seed(0)
    model = QRDQN("MlpPolicy", gym.make("CartPole-v1"), buffer_size=10, learning_starts=10, seed=0, device="cpu",
                  policy_kwargs={"n_quantiles": 5, "net_arch": [16]})
    model.save(root / "qrdqn" / "CartPole-v1_1" / "CartPole-v1.zip")
    return [("qrdqn", "CartPole-v1")]


def compress(path: Path, env_id: str, episodes: int, rollout_steps: int, overrides: list[str],
             out: Path) -> tuple[list[str], dict]:
    """`compress-dqn compress` as a user runs it, through the command line's entry point in this process
    (TensorFlow starts once for every agent): the command and its results.json."""
    from compress_dqn.cli import run_in_process

    command = ["compress-dqn", "compress", str(path), "--env", env_id, "--variants", "ptq-int8",
               "--episodes", str(episodes), "--max-episodes", str(episodes), "--rollout-steps", str(rollout_steps),
               "--out", str(out), "--quiet"]
    for override in overrides:
        command += ["--set", override]
    run_in_process(command[1:])  # its JSON line goes to stderr: stdout is this script's lines alone
    return command, json.loads((out / "results.json").read_text())


def agent_row(zoo: Path, algo: str, env: str, episodes: int, rollout_steps: int, overrides: list[str],
              out: Path) -> dict:
    """One agent through compress: its port check, baseline return beside the Zoo's, and ptq-int8's verdict."""
    path = zoo / algo / f"{env}_1" / f"{env}.zip"
    with zipfile.ZipFile(path) as archive:
        version = archive.read("_stable_baselines3_version").decode() if "_stable_baselines3_version" in archive.namelist() else None
    start = time.perf_counter()
    command, results = compress(path, ENVS[env], episodes, rollout_steps, overrides, out / f"{algo}-{env}")
    baseline, variant = results["variants"][0], results["variants"][1]
    port = results["train"].get("port_check") or {}
    zoo_mean, zoo_std = ZOO_BENCHMARK.get((algo, env), (None, None))
    return {
        "algo": algo, "env_id": env, "played_on": ENVS[env], "sb3_version": version, "command": " ".join(command),
        "port_check": {k: port.get(k) for k in ("checked", "runtime", "states", "max_abs_q_diff", "action_agreement")},
        "ported": bool(port.get("checked")) and (port.get("max_abs_q_diff") or 1.0) <= PORT_TOLERANCE
        and port.get("action_agreement") == 1.0,
        "baseline": {"mean": baseline["return"]["mean"], "std": baseline["return"].get("std"),
                     "episodes": len(baseline["return"]["episodes"])},
        "zoo_benchmark": {"mean": zoo_mean, "std": zoo_std},
        "ptq_int8": {"mean": variant["return"]["mean"], "verdict": variant["return_vs_baseline"]["verdict"]},
        "seconds": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", help="a copy of rl-trained-agents (dqn/ and qrdqn/ inside)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--episodes", type=int, default=100, help="evaluation episodes per policy (and their maximum)")
    parser.add_argument("--rollout-steps", type=int, default=20_000, help="compress-dqn's calibration rollout")
    parser.add_argument("--only", nargs="*", help="ALGO/ENV pairs to run, e.g. qrdqn/CartPole-v1")
    parser.add_argument("--smoke", action="store_true", help="one tiny generated QR-DQN zip, 2 episodes")
    args = parser.parse_args()
    out = Path(args.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    overrides = []
    if args.smoke:
        zoo, agents = out / "zoo", smoke_zoo(out / "zoo")
        args.episodes, args.rollout_steps = 2, 200
        overrides = ["eval.heldout_episodes=1", "measure.saved_model_memory=none", "measure.c_policy=none",
                     "measure.micro=none"]
    elif args.zoo:
        zoo, agents = Path(args.zoo), [(algo, env) for algo in ("dqn", "qrdqn") for env in ENVS]
    else:
        parser.error("give --zoo (a copy of rl-trained-agents) or --smoke")
    if args.only:
        agents = [a for a in agents if "/".join(a) in args.only]
    rows = []
    for algo, env in agents:
        rows.append(agent_row(zoo, algo, env, args.episodes, args.rollout_steps, overrides, out))
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"summary": True, "agents": len(rows), "ported": sum(r["ported"] for r in rows),
                      "worst_max_abs_q_diff": max((r["port_check"]["max_abs_q_diff"] or 0.0) for r in rows),
                      "episodes": args.episodes}))


if __name__ == "__main__":
    main()
