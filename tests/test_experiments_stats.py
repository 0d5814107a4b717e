"""Seed statistics: point values by hand, intervals against a hand-written stratified bootstrap."""
import numpy as np
import pytest

from milegpo_cli.errors import MilegpoError
from milegpo_cli.intervals import wilson_interval

from milegpo_cli.experiments import stats as S


def hand_bootstrap(strata, statistic, seed, n_resamples, confidence=0.95):
    """Percentile stratified bootstrap written out: resample every stratum independently."""
    rng = np.random.default_rng(seed)
    resampled = [s[rng.integers(0, s.size, (n_resamples, s.size))] for s in strata]
    theta = statistic(resampled)
    alpha = (1 - confidence) / 2
    return np.quantile(theta, [alpha, 1 - alpha])


def test_point_values_by_hand():
    x = [0.0, 0.1, 0.2, 0.4, 0.5, 0.7, 0.9, 1.0]
    s = S.summarize(x)
    assert s.n == 8
    assert s.mean.value == pytest.approx(sum(x) / 8)
    assert s.std == pytest.approx(np.sqrt(sum((v - sum(x) / 8) ** 2 for v in x) / 7))
    assert s.iqm.value == pytest.approx((0.2 + 0.4 + 0.5 + 0.7) / 4)  # middle half of 8 values
    assert s.mean.low <= s.mean.value <= s.mean.high


def test_stratified_interval_matches_hand_bootstrap():
    a = np.array([0.2, 0.5, 0.9, 0.4])
    b = np.array([1.0, 0.8, 0.6, 0.7])
    s = S.summarize([a, b], seed=7, n_resamples=500)
    lo, hi = hand_bootstrap([a, b], lambda r: np.concatenate(r, axis=1).mean(axis=1), 7, 500)
    assert (s.mean.low, s.mean.high) == pytest.approx((lo, hi), abs=1e-12)
    assert s.mean.value == pytest.approx(np.r_[a, b].mean())
    # a different seed gives a different (but still bracketing) interval: the seed is honoured
    s2 = S.summarize([a, b], seed=8, n_resamples=500)
    assert (s2.mean.low, s2.mean.high) != (s.mean.low, s.mean.high)


def test_probability_of_improvement_by_hand():
    x, y = [1.0, 2.0, 3.0], [2.0, 2.0, 0.0]
    # x=1: beats 0 -> 1; x=2: ties 2,2, beats 0 -> 2; x=3: beats all -> 3; total 6 of 9 pairs
    p = S.probability_of_improvement([x], [y], seed=0, n_resamples=300)
    assert p.value == pytest.approx(6 / 9)
    assert 0.0 <= p.low <= p.value <= p.high <= 1.0
    # symmetric: P(Y > X) = 1 - P(X > Y)
    assert S.probability_of_improvement([y], [x]).value == pytest.approx(1 - 6 / 9)


def test_gap_is_paired_by_seed_and_stratum():
    ids = [[0.9, 0.8, 0.7], [1.0, 1.0, 0.5]]
    oods = [[0.5, 0.8, 0.6], [1.0, 0.5, 0.5]]
    g = S.gap(ids, oods, seed=1, n_resamples=400)
    diffs = [np.subtract(i, o) for i, o in zip(ids, oods)]
    assert g.mean.value == pytest.approx(np.concatenate(diffs).mean())
    lo, hi = hand_bootstrap(diffs, lambda r: np.concatenate(r, axis=1).mean(axis=1), 1, 400)
    assert (g.mean.low, g.mean.high) == pytest.approx((lo, hi), abs=1e-12)
    with pytest.raises(S.StatsError, match="pair up"):
        S.gap([[1.0, 0.5]], [[1.0]])


def test_degenerate_and_bad_input():
    one = S.summarize([0.75])  # a single seed: the interval collapses to the point
    assert (one.mean.low, one.mean.value, one.mean.high) == (0.75, 0.75, 0.75)
    same = S.summarize([[1.0, 1.0, 1.0], [0.5, 0.5, 0.5]])
    assert same.mean.low == same.mean.high == pytest.approx(0.75)
    with pytest.raises(S.StatsError, match="non-empty"):
        S.summarize([])
    with pytest.raises(S.StatsError, match="finite"):
        S.summarize([1.0, float("nan")])


@pytest.mark.parametrize("k, n", [(3, 10), (0, 10), (10, 10), (12, 64)])
def test_wilson_interval_by_hand(k, n):
    z = 1.959963984540054
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    lo, hi = wilson_interval(k, n)
    assert (lo, hi) == pytest.approx((centre - half, centre + half), abs=1e-12)
    assert 0.0 <= lo <= p <= hi <= 1.0


def test_wilson_interval_edges():
    assert wilson_interval(0, 0) is None
    with pytest.raises(MilegpoError, match="successes"):
        wilson_interval(5, 4)


def test_normalised_area_is_the_trapezoid_mean_height():
    assert S.normalised_area([0, 4, 8, 16], [0.2, 0.4, 0.4, 0.6]) == pytest.approx(
        (4 * 0.3 + 4 * 0.4 + 8 * 0.5) / 16)
    assert S.normalised_area([3], [0.7]) == 0.7  # one point: its height
    with pytest.raises(S.StatsError, match="increase"):
        S.normalised_area([0, 0], [1.0, 1.0])
    with pytest.raises(S.StatsError, match="matching"):
        S.normalised_area([0, 1], [1.0])


def test_minimum_detectable_difference_matches_a_simulated_paired_t_test():
    """At the MDE, a two-sided paired t-test at 5% rejects in about 80% of simulated experiments."""
    from scipy import stats as sst

    d = np.array([0.05, -0.02, 0.08, 0.01, 0.03])
    mde = S.minimum_detectable_difference(d)
    assert mde == pytest.approx((sst.t.ppf(0.975, 4) + sst.t.ppf(0.8, 4)) * d.std(ddof=1) / np.sqrt(5))
    rng = np.random.default_rng(0)
    sims = rng.normal(mde, d.std(ddof=1), (4000, 5))
    rejected = sst.ttest_1samp(sims, 0.0, axis=1).pvalue < 0.05
    assert 0.72 < rejected.mean() < 0.85  # the noncentral t makes the t + t rule approximate
    with pytest.raises(S.StatsError, match=">= 2"):
        S.minimum_detectable_difference([0.1])


def test_seeds_needed_is_the_first_seed_count_whose_mde_reaches_the_target():
    """A 5-seed pilot's spread: at the returned n the MDE of n pairs with that spread is <= target, at
    n - 1 it is not; a simulated n-seed paired t-test then detects the target about 80% of the time."""
    from scipy import stats as sst

    d = np.array([0.05, -0.02, 0.08, 0.01, 0.03])
    s = d.std(ddof=1)

    def mde_at(n: int) -> float:
        return (sst.t.ppf(0.975, n - 1) + sst.t.ppf(0.8, n - 1)) * s / np.sqrt(n)

    n = S.seeds_needed(d, 0.02)
    assert n is not None and mde_at(n) <= 0.02 < mde_at(n - 1)
    assert n > 5  # the pilot's own MDE is above 2 points
    rng = np.random.default_rng(1)
    rejected = sst.ttest_1samp(rng.normal(0.02, s, (4000, n)), 0.0, axis=1).pvalue < 0.05
    assert 0.75 < rejected.mean() < 0.86
    assert S.seeds_needed(d, S.minimum_detectable_difference(d)) <= 5  # the pilot reaches its own MDE
    assert S.seeds_needed(d, 1e-6) is None  # beyond 1,000 seeds
    assert S.seeds_needed([0.1, 0.1, 0.1], 0.02) == 2  # no spread
    with pytest.raises(S.StatsError, match="> 0"):
        S.seeds_needed(d, 0.0)
    with pytest.raises(S.StatsError, match=">= 2"):
        S.seeds_needed([0.1], 0.02)


def test_improvement_p_value_is_exact_under_complete_separation():
    """5 vs 5 seeds, every x above every y: the percentile interval of P(X > Y) is [1, 1], the exact
    two-sided Mann-Whitney p is 2 / C(10, 5) = 2/252."""
    x, y = [0.30, 0.31, 0.32, 0.33, 0.34], [0.10, 0.11, 0.12, 0.13, 0.14]
    p = S.probability_of_improvement([x], [y], n_resamples=300)
    assert (p.value, p.low, p.high) == (1.0, 1.0, 1.0)
    assert S.improvement_p_value(x, y) == pytest.approx(2 / 252)
    assert S.improvement_p_value(x, x) == pytest.approx(1.0)
    with pytest.raises(S.StatsError, match="each side"):
        S.improvement_p_value([], y)
