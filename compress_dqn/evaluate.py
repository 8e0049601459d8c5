"""Greedy evaluation on fixed episode seeds, with a bootstrap confidence interval.

Every variant is evaluated on the same seeds (eval.seed .. eval.seed + episodes - 1), so
differences between variants are paired comparisons, not noise between episode draws.
This module never imports TensorFlow: it takes any `act(obs) -> int`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import numpy as np

from compress_dqn.envs import make_env_from
from compress_dqn.recipe import EnvConfig

Act = Callable[[np.ndarray], int]


@dataclass(frozen=True)
class ReturnStats:
    """Per-episode returns and their summary, as stored in results.json."""

    mean: float
    std: float
    ci95: tuple[float, float]
    episodes: list[float]

    def to_dict(self) -> dict:
        data = asdict(self)
        data["ci95"] = list(self.ci95)
        return data


def bootstrap_ci(values: np.ndarray, confidence: float = 0.95, resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean (fixed seed, so the same returns give the same CI)."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) < 2:
        return float(values.mean()), float(values.mean())
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(resamples, len(values)))].mean(axis=1)
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def summarize(returns: Iterable[float]) -> ReturnStats:
    """Mean, std (population) and 95% bootstrap CI of episode returns."""
    values = np.asarray(list(returns), dtype=np.float64)
    return ReturnStats(
        mean=float(values.mean()),
        std=float(values.std()),
        ci95=bootstrap_ci(values),
        episodes=[float(v) for v in values],
    )


def paired_difference(variant: list[float], baseline: list[float], tolerance: float = 0.01) -> dict:
    """Compare a variant with the baseline episode by episode (same seeds, so the noise of the
    episode draw cancels): mean difference, its 95% bootstrap CI, and a verdict.

    Verdicts: "gain" (CI above 0), "no measurable loss" (CI lower end above -tolerance x |baseline
    mean|), "loss" (CI below 0 and past the tolerance), "inconclusive" (CI includes 0 but cannot
    rule out a loss beyond the tolerance: more episodes are needed).
    """
    a, b = np.asarray(variant, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired comparison needs the same episodes: {a.shape} vs {b.shape}")
    diff = a - b
    lo, hi = bootstrap_ci(diff)
    floor = -tolerance * abs(float(b.mean()))
    if lo > 0:
        verdict = "gain"
    elif lo >= floor:
        verdict = "no measurable loss"
    elif hi < 0:
        verdict = "loss"
    else:
        verdict = "inconclusive"
    return {"mean": float(diff.mean()), "ci95": [lo, hi], "verdict": verdict, "tolerance": tolerance}


def iqm(scores: np.ndarray) -> float:
    """Interquartile mean (Agarwal et al., 2021): the mean of the middle 50% of all scores
    (scipy's trim_mean with 25% cut from each end, over the flattened runs x tasks matrix)."""
    from scipy.stats import trim_mean

    return float(trim_mean(np.asarray(scores, dtype=np.float64), proportiontocut=0.25, axis=None))


def stratified_bootstrap_ci(
    scores: np.ndarray, statistic=iqm, resamples: int = 2000, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile CI of a statistic of a (runs, tasks) score matrix, resampling runs with
    replacement independently within each task (rliable's StratifiedBootstrap)."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim == 1:
        scores = scores[:, None]
    runs, tasks = scores.shape
    rng = np.random.default_rng(seed)
    values = np.empty(resamples)
    for i in range(resamples):
        picks = rng.integers(0, runs, size=(runs, tasks))
        values[i] = statistic(np.take_along_axis(scores, picks, axis=0))
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(values, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def run_episodes(act: Act, env: EnvConfig, seeds: Iterable[int]) -> list[float]:
    """Play one greedy episode per seed and return the undiscounted returns."""
    instance = make_env_from(env)
    returns = []
    try:
        for seed in seeds:
            obs, _ = instance.reset(seed=int(seed))
            total, done = 0.0, False
            while not done:
                obs, reward, terminated, truncated, _ = instance.step(act(obs))
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    finally:
        instance.close()
    return returns


def evaluate(act: Act, env: EnvConfig, episodes: int, seed: int) -> ReturnStats:
    """Evaluate on seeds seed .. seed+episodes-1."""
    return summarize(run_episodes(act, env, range(seed, seed + episodes)))
