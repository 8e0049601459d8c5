import numpy as np
import pytest

from compress_dqn.evaluation.play import evaluate
from compress_dqn.evaluation.verdicts import bootstrap_ci, summarize
from compress_dqn.envs.episodes import run_episodes, run_episodes_side_by_side
from compress_dqn.recipe.schema import EnvConfig


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


def test_episodes_played_side_by_side_return_what_one_at_a_time_play_returns():
    env = EnvConfig(id="CartPole-v1")
    seeds = range(10, 16)
    batches = []

    def lean_q_values(observations):  # lean_policy's greedy choice, row by row
        batches.append(len(observations))
        return np.stack([-observations[:, 2], observations[:, 2]], axis=1)

    side_by_side = run_episodes_side_by_side(lean_q_values, env, seeds)
    one_at_a_time = run_episodes(lean_policy, env, seeds)
    assert side_by_side == one_at_a_time
    assert len(set(one_at_a_time)) > 1  # episodes of different lengths: some finish while others run
    # One call per step of the longest episode, each with every episode's row (one batch shape).
    assert batches == [len(seeds)] * int(max(one_at_a_time))


def test_summary_statistics():
    stats = summarize([1.0, 2.0, 3.0, 4.0])
    assert stats.mean == 2.5
    assert np.isclose(stats.std, np.std([1, 2, 3, 4]))
    lo, hi = stats.ci95
    assert 1.0 <= lo < 2.5 < hi <= 4.0
    assert summarize([5.0, 5.0]).ci95 == (5.0, 5.0)


def test_bootstrap_ci_covers_the_mean_and_narrows_with_more_data():
    rng = np.random.default_rng(0)
    for n in (20, 2000):
        values = rng.normal(10, 2, n)
        lo, hi = bootstrap_ci(values)
        assert lo < values.mean() < hi
        # The percentile bootstrap's 95% width is about the normal one, 2 x 1.96 x s / sqrt(n).
        assert (hi - lo) == pytest.approx(2 * 1.96 * values.std() / np.sqrt(n), rel=0.25)


def test_paired_difference_verdicts_are_a_non_inferiority_test():
    from compress_dqn.evaluation.verdicts import Verdict, keeps_return, paired_difference

    rng = np.random.default_rng(0)
    base = rng.normal(100, 30, 1000)  # enough identical episodes to rule out a rare whole-lead loss
    random = np.full(1000, 20.0)  # the margin is 1% of (100 - 20) = 0.8
    assert paired_difference(base + 0.0, base, random=random).label == "within 1%"
    assert paired_difference(base - 0.3, base, random=random).label == "within 1%"
    assert paired_difference(base - 0.5, base, random=np.full(1000, 99.9)).label == "worse"  # margin 0.001
    assert paired_difference(base + 5.0, base, random=random).label == "better"
    assert paired_difference(base - 20.0, base, random=random).label == "worse"
    assert paired_difference(base - 20.0, base, tolerance=0.3, random=random).label == "within 30%"
    noisy = base + rng.normal(0, 60, 1000) - 2.0  # per-episode noise that 1,000 episodes cannot place
    result = paired_difference(noisy, base, random=random)
    assert result.label == "inconclusive" and result.verdict is Verdict.INCONCLUSIVE
    assert result.ci[0] < -result.margin < result.ci[1]
    assert [keeps_return(v) for v in ("better", "within 1%", "worse", "inconclusive", None)] == [True, True, False, False, False]
    # Pairing removes the shared episode noise: a constant shift is pinned down exactly.
    shifted = paired_difference(base - 3.0, base, random=random)
    assert np.allclose(shifted.ci, [-3.0, -3.0])
    assert shifted.normalized_score == pytest.approx((base.mean() - 3.0 - 20.0) / (base.mean() - 20.0))


def test_a_wider_tolerance_also_gives_the_verdict_at_one_percent_on_the_same_episodes():
    """At eval.tolerance 0.05 the comparison says where the variant stands at 1% too: the same CI
    against a fifth of the margin, so no episode is played for it; at 1% there is nothing to add."""
    from compress_dqn.evaluation.verdicts import Verdict, paired_difference

    rng = np.random.default_rng(0)
    base, random = rng.normal(100, 30, 1000), np.full(1000, 20.0)  # lead 80: margins 4.0 at 5%, 0.8 at 1%
    shifted = paired_difference(base - 2.0, base, 0.05, random)
    assert shifted.label == "within 5%" and shifted.at_one_percent.verdict == "worse"
    assert shifted.margin / shifted.at_one_percent.margin == pytest.approx(5.0)
    assert shifted.at_one_percent.episodes_to_decide is None
    noisy = base + rng.normal(0, 20, 1000) - 0.5
    wide, strict = paired_difference(noisy, base, 0.05, random), paired_difference(noisy, base, 0.01, random)
    assert wide.label == "within 5%" and wide.ci == strict.ci  # the same episodes, the same CI
    at_one = wide.at_one_percent
    assert at_one.kind is Verdict.INCONCLUSIVE and at_one.verdict == strict.label == "inconclusive"
    assert at_one.margin == pytest.approx(strict.margin) and wide.margin / at_one.margin == pytest.approx(5.0)
    assert at_one.episodes_to_decide == strict.episodes_to_decide > 1000
    assert strict.at_one_percent is None and "at_one_percent" not in strict.to_dict()
    assert wide.to_dict()["at_one_percent"] == {"verdict": "inconclusive", "margin": at_one.margin,
                                                "episodes_to_decide": at_one.episodes_to_decide}


def test_identical_episodes_decide_within_only_once_a_rare_whole_lead_loss_is_ruled_out():
    """CartPole-like differences: 0 on most episodes, the baseline's whole lead on a few. The
    percentile bootstrap gave 100 identical episodes the CI [0, 0], a certain 'within 1%', although
    a variant losing 478 points on 2% of episodes (-9.6, twice the margin) shows no loss in its first
    100 episodes 13% of the time."""
    from compress_dqn.evaluation.verdicts import paired_difference

    def verdict(variant, n, confidence=1 - 0.05 / 3):
        return paired_difference(variant, [500.0] * n, 0.01, [22.0] * n, confidence)  # margin 4.78

    for n in (1, 5, 100, 200):
        assert verdict([500.0] * n, n).label == "inconclusive", n
    assert verdict([500.0] * 1, 1).ci[0] == -478.0  # one episode decides nothing
    assert verdict([500.0] * 400, 400).label == "within 1%"  # the rule of three's order: ~3-5 / tolerance
    one_loss = verdict([500.0] * 399 + [22.0], 400)
    assert one_loss.label == "inconclusive" and one_loss.episodes_differing == 1
    # The unseen loss is weighted by the share of identical episodes: where every episode differs
    # (LunarLander) the observed spread carries the tails and the CI is the plain bootstrap's.
    rng = np.random.default_rng(0)
    base, spread = rng.normal(250, 30, 3200), rng.normal(0, 80, 3200)
    out = paired_difference(base + spread, base, 0.01, rng.normal(-180, 100, 3200), 1 - 0.05 / 6)
    assert out.ci == pytest.approx(bootstrap_ci(spread, 1 - 0.05 / 6)) and out.unseen_loss == 0.0
    half = paired_difference(np.where(np.arange(3200) % 2, base + spread, base), base, 0.01, np.full(3200, -180.0))
    assert half.episodes_differing == 1600 and half.unseen_loss == pytest.approx(0.5 * (base.mean() + 180))


def test_a_nan_return_is_refused_in_one_line():
    from compress_dqn.errors import UserError
    from compress_dqn.evaluation.verdicts import paired_difference

    with pytest.raises(UserError, match="NaN or infinite"):
        paired_difference([1.0, float("nan")], [1.0, 2.0], 0.01, [0.0, 0.0])


def test_negative_returns_get_a_margin_from_the_lead_over_random():
    """Returns below zero (LunarLander-like): 1% of |mean| would be tiny; the lead over random is not."""
    from compress_dqn.evaluation.verdicts import paired_difference

    base = np.random.default_rng(1).normal(-50, 5, 2000)
    random = np.full(2000, -250.0)
    out = paired_difference(base - 1.0, base, random=random)
    assert out.margin == pytest.approx(0.01 * (base.mean() + 250.0))
    assert out.label == "within 1%"  # 1.0 < 2.0, the margin
    assert paired_difference(base - 1.0, base).label == "worse"  # 1% of |-50| = 0.5 < 1.0


def test_sequential_looks_and_partial_pairs():
    from compress_dqn.evaluation.verdicts import looks, paired_difference

    assert looks(100, 100) == [100]
    assert looks(100, 800) == [100, 200, 400, 800]
    assert looks(100, 300) == [100, 200, 300]
    base = list(np.arange(400.0))
    out = paired_difference(base[:100], base, random=[0.0] * 400, confidence=0.99)
    assert out.episodes == 100 and out.confidence == 0.99 and out.ci[1] == 0.0
    with pytest.raises(ValueError):
        paired_difference(base, base[:100])


def test_random_policy_returns_do_not_depend_on_the_episodes_before():
    from compress_dqn.envs.episodes import random_returns

    env = EnvConfig(id="CartPole-v1")
    both = random_returns(env, [3, 4], 2)
    assert random_returns(env, [4], 2) == both[1:]
    assert 8 <= np.mean(both) <= 60  # CartPole's random policy: ~22


def test_iqm_and_stratified_bootstrap():
    from compress_dqn.evaluation.verdicts import iqm, stratified_bootstrap_ci

    assert iqm(np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 100.0])) == np.mean([2.0, 3.0, 4.0, 5.0])  # outliers cut
    scores = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0]])  # 4 runs x 2 tasks
    lo, hi = stratified_bootstrap_ci(scores)
    assert lo <= iqm(scores) <= hi
    assert stratified_bootstrap_ci(np.full((5, 1), 7.0)) == (7.0, 7.0)
    # Runs are resampled within each task: a task's values never leak into another's column.
    seen = []
    stratified_bootstrap_ci(scores, statistic=lambda m: seen.append(m.copy()) or np.zeros(len(m)), resamples=20)
    (stack,) = seen
    assert stack.shape == (20, 4, 2)
    assert set(stack[:, :, 0].ravel()) <= {1, 2, 3, 4} and set(stack[:, :, 1].ravel()) <= {10, 20, 30, 40}
    # All resamples drawn at once are the ones drawn one at a time, each statistic that resample's iqm.
    rng, one_at_a_time = np.random.default_rng(0), []
    for _ in range(2000):
        one_at_a_time.append(iqm(np.take_along_axis(scores, rng.integers(0, 4, size=(4, 2)), axis=0)))
    assert stratified_bootstrap_ci(scores) == tuple(float(q) for q in np.quantile(one_at_a_time, [0.025, 0.975]))


def test_iqm_is_rliables_aggregate_iqm():
    """Pinned to the published definition (rliable.metrics.aggregate_iqm), over runs x tasks."""
    from rliable import metrics

    from compress_dqn.evaluation.verdicts import iqm

    rng = np.random.default_rng(0)
    for shape in [(3, 1), (5, 4), (7, 3), (10, 1), (4, 2)]:
        scores = rng.normal(size=shape) * rng.uniform(1, 100)
        assert iqm(scores) == pytest.approx(metrics.aggregate_iqm(scores), rel=1e-12)


def test_inconclusive_says_how_many_episodes_would_decide():
    """An inconclusive verdict estimates the episodes that would decide it; playing that many
    (twice over, from the same spread) does decide it, and decided verdicts carry no estimate."""
    from compress_dqn.evaluation.verdicts import paired_difference

    rng = np.random.default_rng(3)
    baseline, random = [100.0] * 20000, [0.0] * 20000  # margin: 5% of the lead = 5 points
    variant = list(100.0 + rng.normal(0.0, 40.0, 20000))
    first = paired_difference(variant[:100], baseline, 0.05, random)
    assert first.label == "inconclusive"
    needed = first.episodes_to_decide
    assert 200 < needed < 5000
    later = paired_difference(variant[:2 * needed], baseline, 0.05, random)
    assert later.label in ("within 5%", "better") and "episodes_to_decide" not in later.to_dict()


def test_episodes_to_decide_reads_the_arm_that_must_clear_the_margin():
    """A lopsided CI (the demo's pqat-90-int8: -1.2 [-4.8, 0.0] after 400 episodes, margin 4.78)
    is decided by its lower arm: the estimate must exceed the episodes already played (the
    half-width said ~180). Below the margin, the upper arm decides."""
    from compress_dqn.evaluation.verdicts import episodes_to_decide

    needed = episodes_to_decide(400, -4.8, 0.0, -1.2, 4.78)
    assert needed == int(np.ceil(400 * (3.6 / 3.58) ** 2)) and needed > 400
    assert episodes_to_decide(100, -9.0, -4.0, -6.0, 5.0) == 400  # worse needs hi: -4 -> below -5
    assert episodes_to_decide(100, -9.0, -1.0, -5.0, 5.0) is None  # the mean on the margin


def test_a_stored_verdict_label_reads_back_as_its_kind():
    from compress_dqn.evaluation.verdicts import Verdict, keeps_return

    assert Verdict.of("within 1%") is Verdict.WITHIN and Verdict.of("within 2.5%") is Verdict.WITHIN
    assert Verdict.WITHIN.label(0.01) == "within 1%" and Verdict.WORSE.label(0.01) == "worse"
    assert [Verdict.of(v) for v in ("better", "worse", "inconclusive", "reference")] == [
        Verdict.BETTER, Verdict.WORSE, Verdict.INCONCLUSIVE, Verdict.REFERENCE]
    assert Verdict.of(None) is None and Verdict.of("withinish") is None
    assert keeps_return("better") and keeps_return("within 5%")
    assert not any(keeps_return(v) for v in ("worse", "inconclusive", "reference", None))
