"""How often the sequential verdict rule calls a variant "within 1%" that is not, and how often it
decides one that is as good as the baseline: a Monte Carlo of the rule on synthetic returns.

    .venv/bin/python benchmarks/verdict_calibration.py --reps 200
    .venv/bin/python benchmarks/verdict_calibration.py --smoke    # 4 repetitions: checks the script runs

Cases (paired differences against a baseline that scores `base` on every episode, a random policy
at `random`, so the margin is 1% of base - random):
- rare failures (CartPole-like): the variant plays the baseline's episode except that, with
  probability p, it loses L points. With p * L above the margin the variant is NOT within 1%, and
  the rule should say "within" at most ~2.5% of the time (one side of a 5% test).
- identical: p = 0, the variant is as good as the baseline; the share decided "within" is the power.
- spread (LunarLander-like): every episode differs by N(shift, 80); shift = -2 x margin is not within.
Prints one JSON line per case: the share of runs per final verdict, and the episodes used.
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def simulate(draw, looks: list[int], confidence: float, base: float, random: float, reps: int, seed: int) -> dict:
    """Run the sequential rule `reps` times on differences from draw(rng, n); returns the verdict shares."""
    from compress_dqn.evaluation.verdicts import Verdict, paired_difference

    rng = np.random.default_rng(seed)
    outcomes: dict[str, int] = {}
    episodes = []
    for _ in range(reps):
        diffs = draw(rng, looks[-1])
        for n in looks:
            out = paired_difference(list(base + diffs[:n]), [base] * n, 0.01, [random] * n, confidence)
            if out.verdict is not Verdict.INCONCLUSIVE:
                break
        outcomes[out.label] = outcomes.get(out.label, 0) + 1
        episodes.append(out.episodes)
    return {"shares": {k: v / reps for k, v in sorted(outcomes.items())}, "median_episodes": float(np.median(episodes))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--smoke", action="store_true", help="4 repetitions per case: seconds, for the test suite")
    args = parser.parse_args()
    if args.smoke:
        args.reps = 4

    from compress_dqn.evaluation.verdicts import sequential_plan

    cartpole = {"base": 500.0, "random": 22.0}  # margin 4.78
    looks, confidence = sequential_plan(100, 400)  # the demo's plan
    for p, loss in [(0.02, 478.0), (0.015, 478.0), (0.03, 250.0), (0.0, 0.0)]:
        result = simulate(lambda rng, n, p=p, loss=loss: np.where(rng.random(n) < p, -loss, 0.0),
                          looks, confidence, reps=args.reps, seed=args.seed, **cartpole)
        print(json.dumps({"case": "rare failures" if p else "identical", "p": p, "loss": loss,
                          "true_mean_difference": -p * loss, "margin": 4.78, "looks": looks, **result}))
    lunar = {"base": 250.0, "random": -180.0}  # margin 4.3
    looks, confidence = sequential_plan(100, 6400)
    for shift in (-8.6, 0.0):
        result = simulate(lambda rng, n, shift=shift: rng.normal(shift, 80.0, n), looks, confidence,
                          reps=max(args.reps // 4, 1), seed=args.seed, **lunar)
        print(json.dumps({"case": "spread", "shift": shift, "std": 80.0, "margin": 4.3, "looks": looks, **result}))


if __name__ == "__main__":
    main()
