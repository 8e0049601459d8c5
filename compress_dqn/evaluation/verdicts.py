"""Return statistics and verdicts: bootstrap CIs, the paired non-inferiority verdict against the
baseline, sequential looks, and the IQM over training seeds.

Every variant is evaluated on the same seeds (rl.episodes), so differences between variants are
paired comparisons, not noise between episode draws. This module never imports TensorFlow.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from compress_dqn.errors import UserError
from compress_dqn.evaluation.figures import ONE_PERCENT, AtOnePercent, Comparison, ReturnStats, Verdict, keeps_return

__all__ = ["Comparison", "ReturnStats", "Verdict", "keeps_return", "bootstrap_ci", "summarize", "looks", "sequential_plan",
           "paired_difference", "episodes_to_decide", "iqm", "iqm_each", "stratified_bootstrap_ci", "ONE_PERCENT", "AtOnePercent"]


def bootstrap_ci(values: np.ndarray, confidence: float = 0.95, resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean (fixed seed, so the same returns give the same CI).
    Resamples are drawn in blocks of ~4M values, so memory stays bounded however many episodes a look holds."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) < 2:
        return float(values.mean()), float(values.mean())
    rng = np.random.default_rng(seed)
    n = len(values)
    block = max(1, (1 << 22) // n)
    means = np.concatenate([values[rng.integers(0, n, size=(min(block, resamples - start), n))].mean(axis=1)
                            for start in range(0, resamples, block)])
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


def looks(first: int, cap: int) -> list[int]:
    """Episode counts at which a sequential evaluation looks at its verdicts: first, doubling, cap."""
    counts = [first]
    while counts[-1] < cap:
        counts.append(min(2 * counts[-1], cap))
    return counts


def sequential_plan(episodes: int, max_episodes: int | None) -> tuple[list[int], float]:
    """The looks of a sequential evaluation and each look's CI level: 1 - 0.05/looks (Bonferroni),
    so looking repeatedly keeps a 5% error rate overall."""
    plan = looks(episodes, max_episodes or episodes)
    return plan, 1.0 - 0.05 / len(plan)


def paired_difference(
    variant: list[float],
    baseline: list[float],
    tolerance: float = 0.01,
    random: list[float] | None = None,
    confidence: float = 0.95,
) -> Comparison:
    """A non-inferiority test of a variant against the baseline, episode by episode.

    The episodes share seeds, so the episode draw's noise cancels in the per-episode differences.
    The margin is `tolerance` of the baseline's lead over a uniform-random policy on the same
    episodes (the random policy's returns), so 1% means the same on tasks whose returns are near
    zero or negative; without them, of |baseline mean|. Verdicts, from the difference's bootstrap CI:
    "better" (above 0), "within 1%" (lower end above -margin), "worse" (upper end below -margin),
    "inconclusive" (the CI straddles -margin: more episodes would decide).
    Only the first len(variant) baseline and random episodes are used.

    Where `tolerance` is wider than 1% (ONE_PERCENT), `at_one_percent` also holds the verdict at 1%:
    the same CI against a margin of 1% of the same lead, so on the same episodes with no more played.

    The lower end is taken with one more paired episode, an `unseen_loss`: the baseline's whole
    lead (or the largest loss seen if larger) times the share of episodes whose returns were
    identical. A percentile bootstrap cannot see a loss it has not sampled: 100 identical episodes
    gave the CI [0, 0] and a certain "within 1%", so a variant that loses the whole lead on 2% of
    CartPole's episodes was called within 1% in 13% of simulated runs. With the extra episode,
    identical episodes decide "within 1%" only from ~400 on (the rule of three's order). Where
    every episode differs (LunarLander), the observed spread already carries the tails, and the CI
    is the plain bootstrap's.
    """
    a = np.asarray(variant, dtype=np.float64)
    n = len(a)
    if n == 0 or len(baseline) < n or (random is not None and len(random) < n):
        raise ValueError(f"paired comparison needs the same episodes: {n} vs {len(baseline)} baseline episodes")
    b = np.asarray(baseline[:n], dtype=np.float64)
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b)) and (random is None or np.all(np.isfinite(random[:n])))):
        raise UserError("an episode return is NaN or infinite: the environment or the policy broke (check its weights)")
    diff = a - b
    random_mean = float(np.mean(random[:n])) if random is not None else None
    scale = float(b.mean()) - random_mean if random_mean is not None else abs(float(b.mean()))
    margin = tolerance * max(scale, 0.0)
    identical = n - int(np.count_nonzero(diff))
    unseen_loss = max(scale, 0.0, float(-diff.min())) * identical / n
    lo, hi = bootstrap_ci(diff, confidence=confidence)
    if unseen_loss > 0:
        lo = min(lo, bootstrap_ci(np.append(diff, -unseen_loss), confidence=confidence)[0])
    mean = float(diff.mean())
    verdict = _verdict(lo, hi, margin)
    extra: dict[str, float | int | AtOnePercent | None] = {}
    if verdict is Verdict.INCONCLUSIVE:
        extra["episodes_to_decide"] = episodes_to_decide(n, lo, hi, mean, margin)
    if random_mean is not None:
        extra["random_mean"] = random_mean
        extra["normalized_score"] = float((a.mean() - random_mean) / scale) if scale > 0 else None
    if tolerance > ONE_PERCENT:
        extra["at_one_percent"] = _at_one_percent(n, lo, hi, mean, ONE_PERCENT * max(scale, 0.0))
    return Comparison(mean=mean, ci=(lo, hi), confidence=confidence, verdict=verdict, tolerance=tolerance,
                      margin=margin, episodes=n, unseen_loss=unseen_loss, episodes_differing=n - identical, **extra)


def _at_one_percent(n: int, lo: float, hi: float, mean: float, margin: float) -> AtOnePercent:
    """The verdict of the same CI against the 1% margin, with the episodes an open one would need."""
    verdict = _verdict(lo, hi, margin)
    return AtOnePercent(verdict=verdict.label(ONE_PERCENT), margin=margin,
                        episodes_to_decide=episodes_to_decide(n, lo, hi, mean, margin)
                        if verdict is Verdict.INCONCLUSIVE else None)


def _verdict(lo: float, hi: float, margin: float) -> Verdict:
    """The verdict of a difference's CI [lo, hi] against -margin."""
    if lo > 0:
        return Verdict.BETTER
    if lo >= -margin:
        return Verdict.WITHIN
    if hi < -margin:
        return Verdict.WORSE
    return Verdict.INCONCLUSIVE


def episodes_to_decide(n: int, lo: float, hi: float, mean: float, margin: float) -> int | None:
    """About how many paired episodes would decide an inconclusive verdict if the mean difference
    and its spread held: the CI's arm on the margin's side (mean - lo above the margin, hi - mean
    below it) shrinks as 1/sqrt(n) until the CI clears -margin. One arm, not the half-width: a
    bootstrap CI of skewed differences (mostly 0, a few large losses) is lopsided.
    Why: "inconclusive" should say what it would take (LunarLander's paired differences spread by
    50-130 points, so a 1% margin of ~4 points can need thousands of episodes). None where the
    mean sits on the margin itself."""
    distance = mean + margin  # > 0: within would be decided; < 0: worse would
    arm = mean - lo if distance > 0 else hi - mean
    if distance == 0 or arm <= 0:
        return None
    return int(np.ceil(n * (arm / abs(distance)) ** 2))


def iqm(scores: np.ndarray) -> float:
    """Interquartile mean (Agarwal et al., 2021): the mean of the middle 50% of all scores
    (scipy's trim_mean with 25% cut from each end, over the flattened runs x tasks matrix)."""
    return float(iqm_each(np.asarray(scores)[None])[0])


def iqm_each(resampled: np.ndarray) -> np.ndarray:
    """iqm of each (runs, tasks) matrix in a stack of them, in one call (2,000 calls of iqm, one a
    resample, took ~0.5 s a CI in scipy's per-call overhead; the values are the same)."""
    from scipy.stats import trim_mean

    flat = np.asarray(resampled, dtype=np.float64).reshape(len(resampled), -1)
    return np.asarray(trim_mean(flat, proportiontocut=0.25, axis=1), dtype=np.float64)


def stratified_bootstrap_ci(
    scores: np.ndarray, statistic=iqm_each, resamples: int = 2000, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile CI of a statistic of a (runs, tasks) score matrix, resampling runs with
    replacement independently within each task (rliable's StratifiedBootstrap). `statistic` maps a
    (resamples, runs, tasks) stack to one value per resample."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim == 1:
        scores = scores[:, None]
    runs, tasks = scores.shape
    rng = np.random.default_rng(seed)
    # One draw of every resample's picks: the same stream, in the same order, as one draw a resample.
    picks = rng.integers(0, runs, size=(resamples, runs, tasks))
    values = statistic(np.take_along_axis(np.broadcast_to(scores, (resamples, runs, tasks)), picks, axis=1))
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(values, [alpha, 1.0 - alpha])
    return float(lo), float(hi)
