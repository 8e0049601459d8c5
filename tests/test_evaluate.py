import numpy as np

from compress_dqn.evaluate import bootstrap_ci, evaluate, summarize
from compress_dqn.recipe import EnvConfig


def lean_policy(obs):
    """A weak fixed heuristic (push towards the lean): returns vary with the episode seed."""
    return int(obs[2] > 0)


def test_evaluation_is_deterministic_on_fixed_seeds():
    env = EnvConfig(id="CartPole-v1")
    first = evaluate(lean_policy, env, episodes=5, seed=10)
    second = evaluate(lean_policy, env, episodes=5, seed=10)
    other = evaluate(lean_policy, env, episodes=5, seed=20)
    assert first.episodes == second.episodes
    assert len(first.episodes) == 5
    assert first.episodes != other.episodes  # the seeds matter


def test_summary_statistics():
    stats = summarize([1.0, 2.0, 3.0, 4.0])
    assert stats.mean == 2.5
    assert np.isclose(stats.std, np.std([1, 2, 3, 4]))
    lo, hi = stats.ci95
    assert 1.0 <= lo < 2.5 < hi <= 4.0
    assert summarize([5.0, 5.0]).ci95 == (5.0, 5.0)


def test_bootstrap_ci_covers_the_mean_and_narrows_with_more_data():
    rng = np.random.default_rng(0)
    small = bootstrap_ci(rng.normal(10, 2, 20))
    large = bootstrap_ci(rng.normal(10, 2, 2000))
    assert small[0] < 10 < small[1] or abs(np.mean(small) - 10) < 2
    assert (large[1] - large[0]) < (small[1] - small[0])


def test_paired_difference_verdicts():
    from compress_dqn.evaluate import paired_difference

    rng = np.random.default_rng(0)
    base = rng.normal(100, 30, 100)
    assert paired_difference(base + 0.0, base)["verdict"] == "no measurable loss"
    assert paired_difference(base + 5.0, base)["verdict"] == "gain"
    assert paired_difference(base - 20.0, base)["verdict"] == "loss"
    noisy = base + rng.normal(0, 60, 100)  # same mean, huge per-episode noise
    result = paired_difference(noisy, base)
    assert result["verdict"] in ("inconclusive", "gain", "loss")
    assert result["ci95"][0] < result["mean"] < result["ci95"][1]
    # Pairing removes the shared episode noise: a constant shift is pinned down exactly.
    shifted = paired_difference(base - 3.0, base)
    assert np.allclose(shifted["ci95"], [-3.0, -3.0])


def test_iqm_and_stratified_bootstrap():
    from compress_dqn.evaluate import iqm, stratified_bootstrap_ci

    assert iqm(np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 100.0])) == np.mean([2.0, 3.0, 4.0, 5.0])  # outliers cut
    scores = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0]])  # 4 runs x 2 tasks
    lo, hi = stratified_bootstrap_ci(scores)
    assert lo <= iqm(scores) <= hi
    assert stratified_bootstrap_ci(np.full((5, 1), 7.0)) == (7.0, 7.0)
    # Runs are resampled within each task: a task's values never leak into another's column.
    seen = []
    stratified_bootstrap_ci(scores, statistic=lambda m: seen.append(m.copy()) or 0.0, resamples=20)
    assert all(set(m[:, 0]) <= {1, 2, 3, 4} and set(m[:, 1]) <= {10, 20, 30, 40} for m in seen)
