"""Structured pruning's unit ranks: how close a narrowed baseline starts to the teacher, and stays after a distillation.

    .venv/bin/python benchmarks/structured_ranks.py --model rl-trained-agents/dqn/LunarLander-v2_1/LunarLander-v2.zip \\
        --env LunarLander-v3 --students '[[64, 64], [32, 32], [16, 16]]' --steps 3000
    .venv/bin/python benchmarks/structured_ranks.py --model runs/si/seed-0 --env MinAtar/SpaceInvaders-v1 \\
        --students '[{"conv": [{"filters": 8, "kernel": 3}], "net_arch": [64]}]' --steps 5000
    .venv/bin/python benchmarks/structured_ranks.py --smoke

The baseline (any file `baseline.from` takes) plays 20,000 steps epsilon-greedily (0.05) as the
distillation's replay, and 5,000 greedy steps on another seed as held-out states. Each student
shape starts fresh (Keras' seed 0) or as the baseline narrowed by each rank (compress/structured.py,
ranked on 2,048 replay states), then distils `--steps` steps (policy loss, 1e-3 decaying to 0).
Prints one JSON line per shape and start: the share of held-out states where its action is the
baseline's, on all of them and on the decisive half (the baseline's gap above its median), at the
start and after the distillation.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np


def agreement(model, states: np.ndarray, teacher_q: np.ndarray) -> dict[str, float]:
    from compress_dqn.rl.networks import make_actor

    top = np.sort(teacher_q, axis=1)
    decisive = top[:, -1] - top[:, -2] > np.median(top[:, -1] - top[:, -2])
    same = make_actor(model).q_values(states).argmax(1) == teacher_q.argmax(1)
    return {"all": round(float(same.mean()), 4), "decisive": round(float(same[decisive].mean()), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--env")
    parser.add_argument("--students", default="[[64, 64], [32, 32]]", help="JSON list of widths or student configs")
    parser.add_argument("--starts", default="fresh,gap,activation,magnitude")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--margin-weight", type=float, default=0.0, help="the distillation's fine_tune.margin_weight")
    parser.add_argument("--replay-steps", type=int, default=20_000)
    parser.add_argument("--heldout-steps", type=int, default=5_000)
    parser.add_argument("--smoke", action="store_true", help="a random 32x32 CartPole network, [[8, 8]] fresh and by gap, 50 steps")
    args = parser.parse_args()
    from compress_dqn._tf import tf_keras
    from compress_dqn.compress.distill import Distiller, build_student
    from compress_dqn.compress.structured import shrink_from_teacher
    from compress_dqn.envs.environment import probe_env
    from compress_dqn.port.baseline import load_model, rollout
    from compress_dqn.recipe.schema import EnvConfig, FineTuneConfig, StudentConfig
    from compress_dqn.rl.networks import build_q_network, make_actor

    if args.smoke:
        args.env, args.students, args.steps, args.replay_steps, args.heldout_steps = "CartPole-v1", "[[8, 8]]", 50, 600, 300
        args.starts = "fresh,gap"
        tf_keras.utils.set_random_seed(0)
        args.model = str(Path(tempfile.mkdtemp()) / "random.keras")
        build_q_network((4,), 2, [32, 32]).save(args.model)
    env = EnvConfig(id=args.env)
    info = probe_env(env)
    teacher = load_model(args.model, info)
    replay, _ = rollout(teacher, env, info, args.replay_steps, 0.05, 2 * args.replay_steps, 0)
    heldout, _ = rollout(teacher, env, info, args.heldout_steps, 0.0, 2 * args.heldout_steps, 1)
    states = heldout.observations_at(np.arange(heldout.size))
    teacher_q = make_actor(teacher).q_values(states)
    for shape in json.loads(args.students):
        config = StudentConfig(**shape) if isinstance(shape, dict) else StudentConfig(net_arch=shape)
        for start in args.starts.split(","):
            tf_keras.utils.set_random_seed(0)
            student = build_student(info, config)
            if start != "fresh":
                shrink_from_teacher(teacher, student, replay.sample_observations(2048), start)
            before = agreement(student, states, teacher_q)
            clock = time.perf_counter()
            ft = FineTuneConfig(steps=args.steps, learning_rate=1e-3, learning_rate_schedule="linear",
                                margin_weight=args.margin_weight)
            Distiller(student, teacher, replay, ft, quiet=True).run()
            print(json.dumps({"env": args.env, "student": config.model_dump(mode="json", exclude_defaults=True),
                              "start": start, "steps": args.steps, "margin_weight": args.margin_weight, "agreement_start": before,
                              "agreement_after": agreement(student, states, teacher_q),
                              "distill_seconds": round(time.perf_counter() - clock, 1)}), flush=True)


if __name__ == "__main__":
    main()
