"""The RL Zoo's classic-control DQN and QR-DQN agents through `compress-dqn search`: winner, ratio, verdict, why not.

    .venv/bin/python benchmarks/zoo_search.py --zoo /work/zoo --out runs/zoo-search
    .venv/bin/python benchmarks/zoo_search.py --out runs/zoo-search-smoke --smoke
    .venv/bin/python benchmarks/zoo_search.py --out runs/x --ptq-float-head runs/rl-zoo-agents/*/ --episodes 100

--zoo is a copy of github.com/DLR-RM/rl-trained-agents (dqn/ENV_1/ENV.zip and qrdqn/ENV_1/ENV.zip of the four
classic-control games, with their config dirs beside), as benchmarks/rl_zoo_agents.py takes it. Each agent runs
as a user runs it, one after another, in its own interpreter:

    compress-dqn search ALGO/ENV_1/ENV.zip --env ENV --out OUT/ALGO-ENV --quiet [--max-episodes N] [--set K=V]

(LunarLander-v2 plays on LunarLander-v3). A directory that already holds a finished search is read, not rerun
(`search` itself resumes one that stopped). Prints one JSON line per agent: the search's winner, its gzipped
bytes beside the baseline's (gzip to gzip), the ratio, its verdict on each seed, whether it meets the line
(--line, 50x, kept within tolerance), every candidate's outcome with its build and play seconds, the search's
time (its estimate after the first rung, then baselines, builds, plays and finishing), and for an agent with
no such winner the reasons its seed-0 report gives for the candidates that lost (evaluation.diagnosis.diagnoses,
measured on the held-out states); then a summary line. --smoke writes one tiny untrained QR-DQN zip and
searches it with one 8-unit student, a few fine-tune steps and 2 episodes: what the pipeline does, not what it
finds.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.modules.setdefault("torch.utils.tensorboard", None)  # as rl_zoo_agents.py: SB3's logger would import TensorFlow

ENVS = {"CartPole-v1": "CartPole-v1", "Acrobot-v1": "Acrobot-v1", "MountainCar-v0": "MountainCar-v0",
        "LunarLander-v2": "LunarLander-v3"}
"""The Zoo's env id -> the gymnasium id it is played on."""
ALGOS = ("dqn", "qrdqn")
SMOKE_SET = ["eval.heldout_episodes=1", "measure.saved_model_memory=none", "search.student_fine_tune.steps=200",
             "search.student_fine_tune.student_states=0", "search.student_fine_tune.select_interval=0",
             "search.qat_steps=50", "search.student_candidates=null"]
"""--smoke's overrides: one short build of one student, no DAgger states, no snapshot selection."""


SMOKE_AGENTS = [("qrdqn", "CartPole-v1")]


def smoke_zoo(root: Path) -> None:
    """A one-agent stand-in for rl-trained-agents: an untrained sb3-contrib QR-DQN on CartPole-v1 (SMOKE_AGENTS)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from rl_zoo_agents import smoke_zoo as tiny_zip

    assert tiny_zip(root) == SMOKE_AGENTS


def search(path: Path, env_id: str, out: Path, args: list[str], make_zip=None) -> tuple[list[str], float | None]:
    """`compress-dqn search` in a fresh interpreter (unless out holds a finished search): the command and its seconds.
    make_zip: writes the zip first where it is generated (--smoke), only when the search must run."""
    command = ["compress-dqn", "search", str(path), "--env", env_id, "--out", str(out), "--quiet", *args]
    if (out / "results.json").is_file() and (out / "search.json").is_file():
        return command, None
    if make_zip is not None and not path.is_file():
        make_zip()
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "compress_dqn", *command[1:]], capture_output=True, text=True,
                          env={**os.environ, "COMPRESS_DQN_TF_LOGS": "0"})
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return command, round(time.perf_counter() - start, 1)


def agent_row(out: Path, line: float) -> dict:
    """One finished search: its winner against the baseline, gzip to gzip, and the seed-0 report's reasons."""
    from compress_dqn.evaluation.diagnosis import diagnoses
    from compress_dqn.evaluation.reasons import reason_lines
    from compress_dqn.evaluation.results import load_results

    summary = load_results(out / "results.json")
    seed_dir = (out / summary.runs[0]).parent
    seed = load_results(seed_dir / "results.json")
    found = summary.search
    baseline_gzip = seed.baseline.size.tflite_gzip_bytes
    tried = [{"name": t.name, "outcome": t.outcome, "gzip_bytes": t.objective,
              "per_seed": {s: {"verdict": o.verdict, "episodes": o.episodes, "difference": round(o.difference, 2),
                               "ci": [round(x, 2) for x in o.ci], "build_seconds": o.build_seconds,
                               "play_seconds": o.play_seconds} for s, o in t.per_seed.items()},
              **({"note": t.note} if t.note else {})}
             for t in found.tried]
    winner = next((t for t in tried if t["name"] == found.winner), None)
    ratio = baseline_gzip / winner["gzip_bytes"] if winner and winner["gzip_bytes"] else None
    meets = ratio is not None and ratio >= line
    data = seed.train.source.data if seed.train.source is not None else None
    row = {"baseline": {"mean": round(seed.baseline.returns.mean, 2), "episodes": seed.baseline.episodes,
                        "gzip_bytes": baseline_gzip},
           "rollout": data.model_dump(exclude_none=True) if data is not None else None,
           "random_mean": round(seed.random.returns.mean, 2), "winner": found.winner,
           "winner_gzip_bytes": winner["gzip_bytes"] if winner else None,
           "ratio": round(ratio, 1) if ratio else None, "winner_per_seed": winner["per_seed"] if winner else None,
           "meets_line": meets, "tried": tried, "search_seconds": round(found.cost.wall_seconds, 1),
           "cost": found.cost.model_dump(exclude_none=True)}
    if not meets:
        row["reasons"] = reason_lines(seed, diagnoses(seed, seed_dir))
    return row


def ptq_float_head(run: Path, episodes: int) -> dict:
    """A finished run's ptq-int8 beside the same file with a float Q-head, emulated (evaluation.findings.FloatHeadPolicy:
    the int8 body's last activation, dequantized, times the baseline's float output layer). Both and the baseline play
    the run's first `episodes` evaluation episodes; paired verdicts at 1%, and greedy-action agreement on the held-out
    states. A float head is at least as exact as any int8 output scale (per-channel ones included): where it does not
    hold, no output scale will."""
    import numpy as np

    from compress_dqn.deploy.litert.policy import TFLitePolicy
    from compress_dqn.envs.episodes import play_side_by_side, random_returns
    from compress_dqn.evaluation.diagnosis import float_head_policy
    from compress_dqn.evaluation.results import load_results
    from compress_dqn.evaluation.verdicts import paired_difference
    from compress_dqn.fileio import load_dict
    from compress_dqn.recipe.schema import load_recipe

    results, recipe = load_results(run / "results.json"), load_recipe(run / "recipe.yaml")
    tflite = run / "variants" / "ptq-int8" / "policy.tflite"
    float_head = float_head_policy(tflite, run / "baseline" / "weights.npz").actions
    base, ptq = TFLitePolicy(run / "baseline" / "policy.tflite"), TFLitePolicy(tflite)
    states = load_dict(run / "baseline" / "heldout_obs.npz")["observations"]
    reference = base.actions(states)
    seeds = range(results.eval.seed, results.eval.seed + episodes)
    baseline = play_side_by_side(lambda o, _: base.actions(o), recipe.env, seeds, 256)
    rand = random_returns(recipe.env, seeds, base.n_actions)
    row = {"run": str(run), "episodes": episodes, "baseline": round(float(np.mean(baseline)), 2)}
    for name, act in (("ptq_int8", ptq.actions), ("ptq_int8_float_head", float_head)):
        returns = play_side_by_side(lambda o, _, act=act: act(o), recipe.env, seeds, 256)
        versus = paired_difference(returns, baseline, 0.01, rand)
        row[name] = {"mean": round(float(np.mean(returns)), 2), "verdict": versus.label,
                     "difference": round(versus.mean, 2), "ci": [round(x, 2) for x in versus.ci],
                     "agreement": round(float(np.mean(act(states) == reference)), 3)}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", help="a copy of rl-trained-agents (dqn/ and qrdqn/ inside)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", nargs="*", help="ALGO/ENV pairs to run, e.g. qrdqn/CartPole-v1")
    parser.add_argument("--max-episodes", type=int, help="search's --max-episodes (its default where not given)")
    parser.add_argument("--set", action="append", default=[], dest="overrides", help="a recipe override for search")
    parser.add_argument("--line", type=float, default=50.0, help="the size ratio a winner must reach (gzip to gzip)")
    parser.add_argument("--smoke", action="store_true", help="one tiny generated QR-DQN zip, one tiny student")
    parser.add_argument("--ptq-float-head", nargs="*", metavar="RUN", help="finished compress runs with ptq-int8: "
                        "play it beside the same file with a float Q-head (emulated), instead of searching")
    parser.add_argument("--episodes", type=int, default=100, help="--ptq-float-head's episodes")
    args = parser.parse_args()
    if args.ptq_float_head:
        for run in args.ptq_float_head:
            print(json.dumps(ptq_float_head(Path(run), args.episodes)), flush=True)
        return
    out = Path(args.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    extra = ["--max-episodes", str(args.max_episodes)] if args.max_episodes else []
    overrides = list(args.overrides)
    if args.smoke:
        zoo, agents = out / "zoo", SMOKE_AGENTS
        extra = ["--episodes", "2", "--max-episodes", "2", "--rollout-steps", "300", "--students", "8",
                 "--sparsities", ""]
        overrides = SMOKE_SET + overrides
    elif args.zoo:
        zoo, agents = Path(args.zoo), [(algo, env) for algo in ALGOS for env in ENVS]
    else:
        parser.error("give --zoo (a copy of rl-trained-agents) or --smoke")
    if args.only:  # in the order given
        agents = [a for name in args.only for a in agents if "/".join(a) == name]
    rows = []
    for algo, env in agents:
        run = out / f"{algo}-{env}"
        command, seconds = search(zoo / algo / f"{env}_1" / f"{env}.zip", ENVS[env], run,
                                  extra + [a for o in overrides for a in ("--set", o)],
                                  make_zip=(lambda: smoke_zoo(zoo)) if args.smoke else None)
        rows.append({"algo": algo, "env_id": env, "played_on": ENVS[env], "command": shlex.join(command),
                     "seconds": seconds, **agent_row(run, args.line)})
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"summary": True, "agents": len(rows), "meet_line": sum(r["meets_line"] for r in rows),
                      "line": args.line, "winners": {f"{r['algo']}/{r['env_id']}": r["winner"] for r in rows}}))


if __name__ == "__main__":
    main()
