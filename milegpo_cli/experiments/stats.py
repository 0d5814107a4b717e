"""Seed statistics for experiment tables, in the style of rliable (Agarwal et al., 2021).

Pure functions on plain arrays. The unit of variation is a training run (a seed); scores may be
split into *strata* (ALFWorld's six task types, WebShop categories), each a 1-D array with one value
per seed. Confidence intervals come from the stratified bootstrap: every stratum is resampled
independently (``scipy.stats.bootstrap`` with ``paired=False`` does exactly this), percentile method
(rliable's default; unlike BCa it stays defined on degenerate data such as 3 seeds all at 1.0).

- mean, std (ddof=1), interquartile mean IQM = ``scipy.stats.trim_mean(x, 0.25)`` of pooled values;
- probability of improvement P(X > Y) = 1/M sum_m (1/(N K)) sum_ij [x_mi > y_mj] + 0.5 [x_mi = y_mj];
- ID-to-OOD gap = mean of paired differences id - ood (same seed, same stratum);
- normalised area under a learning curve AUC = 1/(x_K - x_0) sum_k (x_k - x_{k-1}) (y_k + y_{k-1}) / 2;
- Mann-Whitney U test of P(X > Y) = 1/2 (exact for small samples without ties): U / (n m) is the
  probability of improvement, and unlike its percentile interval, which collapses to [1, 1] once
  every x beats every y, its p-value reflects how few seeds there are (5 vs 5: p >= 2/252);
- minimum detectable difference of a paired comparison of n seeds with differences of std s:
  MDE = (t_{1-alpha/2, n-1} + t_{power, n-1}) s / sqrt(n) (two-sided test at level alpha);
- Wilson score interval of one evaluation's success rate (episodes of one run).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np
from scipy import stats

from milegpo_cli.errors import MilegpoError

CONFIDENCE = 0.95
N_RESAMPLES = 2000


class StatsError(MilegpoError, ValueError):
    """Bad input to a statistic (empty or mismatched samples)."""


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its confidence interval."""

    value: float
    low: float
    high: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Summary:
    """Seed statistics of one metric of one method."""

    n: int  # number of seeds (values per stratum)
    mean: Estimate
    std: float
    iqm: Estimate

    def to_dict(self) -> dict:
        return {"n": self.n, "mean": self.mean.to_dict(), "std": self.std, "iqm": self.iqm.to_dict()}


def format_interval(value: float, low: float, high: float, digits: int = 2, scale: float = 1.0,
                    signed: bool = False) -> str:
    """``value [low, high]``, each times ``scale``, with ``digits`` decimals (``signed``: a + on positives)."""
    spec = f"{'+' if signed else ''}.{digits}f"
    return f"{value * scale:{spec}} [{low * scale:{spec}}, {high * scale:{spec}}]"


def _as_strata(strata: Sequence[Sequence[float]] | np.ndarray) -> list[np.ndarray]:
    """One float array per stratum; a flat sequence of numbers is a single stratum."""
    arr = [np.asarray(s, dtype=float) for s in strata]
    if arr and all(a.ndim == 0 for a in arr):
        arr = [np.asarray(arr, dtype=float)]
    if not arr or any(a.ndim != 1 or a.size == 0 for a in arr):
        raise StatsError("strata: need at least one non-empty 1-D sample per stratum")
    if any(not np.all(np.isfinite(a)) for a in arr):
        raise StatsError("strata: values must be finite")
    return arr


def _pooled_mean(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.concatenate(samples, axis=axis).mean(axis=axis)


def _pooled_iqm(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
    return stats.trim_mean(np.concatenate(samples, axis=axis), 0.25, axis=axis)


def stratified_bootstrap(
    strata: Sequence[np.ndarray],
    statistic: Callable[..., np.ndarray],
    *,
    confidence: float = CONFIDENCE,
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
) -> Estimate:
    """statistic(*strata) with a percentile interval from resampling each stratum independently.

    ``statistic`` is vectorised: it takes one array per stratum and reduces along ``axis``.
    """
    point = float(statistic(*strata, axis=-1))
    free = [i for i, st in enumerate(strata) if st.size > 1 and not np.all(st == st[0])]
    if not free:
        return Estimate(point, point, point)  # nothing varies under resampling

    def resampled(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
        # strata that cannot vary (one seed, or all equal) are held fixed, broadcast to the batch
        batch = samples[0].shape[:-1]
        full = [np.broadcast_to(st, batch + st.shape) for st in strata]
        for i, smp in zip(free, samples):
            full[i] = smp
        return statistic(*full, axis=axis)

    res = stats.bootstrap(
        tuple(strata[i] for i in free), resampled, n_resamples=n_resamples, confidence_level=confidence,
        method="percentile", paired=False, vectorized=True, rng=np.random.default_rng(seed),
    )
    ci = res.confidence_interval
    return Estimate(point, float(ci.low), float(ci.high))


def summarize(strata, *, confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES, seed: int = 0) -> Summary:
    """Mean, std, IQM of the pooled values, with stratified-bootstrap CIs for the mean and the IQM."""
    s = _as_strata(strata)
    pooled = np.concatenate(s)
    kw = dict(confidence=confidence, n_resamples=n_resamples, seed=seed)
    return Summary(
        n=max(a.size for a in s),
        mean=stratified_bootstrap(s, _pooled_mean, **kw),
        std=float(pooled.std(ddof=1)) if pooled.size > 1 else 0.0,
        iqm=stratified_bootstrap(s, _pooled_iqm, **kw),
    )


def probability_of_improvement(
    x_strata, y_strata, *, confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES, seed: int = 0
) -> Estimate:
    """P(X > Y) + 0.5 P(X = Y), averaged over strata, with a stratified-bootstrap CI (rliable)."""
    xs, ys = _as_strata(x_strata), _as_strata(y_strata)
    if len(xs) != len(ys):
        raise StatsError(f"probability_of_improvement: {len(xs)} strata for X but {len(ys)} for Y")
    m = len(xs)

    def poi(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
        per_stratum = []
        for x, y in zip(samples[:m], samples[m:]):
            d = x[..., :, None] - y[..., None, :]
            per_stratum.append(((d > 0) + 0.5 * (d == 0)).mean(axis=(-2, -1)))
        return np.mean(per_stratum, axis=0)

    return stratified_bootstrap(xs + ys, poi, confidence=confidence, n_resamples=n_resamples, seed=seed)


def gap(id_strata, ood_strata, **kw) -> Summary:
    """ID-to-OOD gap: summary of the paired differences id - ood (same seed, same stratum)."""
    ids, oods = _as_strata(id_strata), _as_strata(ood_strata)
    if len(ids) != len(oods) or any(a.shape != b.shape for a, b in zip(ids, oods)):
        raise StatsError("gap: id and ood scores must pair up (same strata, same seeds)")
    return summarize([a - b for a, b in zip(ids, oods)], **kw)


def normalised_area(x: Sequence[float], y: Sequence[float]) -> float:
    """Area under the curve y(x) by the trapezoid rule over its span: the curve's mean height."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if xs.ndim != 1 or xs.shape != ys.shape or xs.size < 1:
        raise StatsError(f"normalised_area: need matching 1-D x and y, got {xs.shape} and {ys.shape}")
    if np.any(np.diff(xs) <= 0):
        raise StatsError("normalised_area: x must increase")
    if xs.size == 1:
        return float(ys[0])
    return float(np.sum(np.diff(xs) * (ys[1:] + ys[:-1]) / 2) / (xs[-1] - xs[0]))


def minimum_detectable_difference(differences: Sequence[float], *, alpha: float = 0.05, power: float = 0.8) -> float:
    """MDE = (t_{1-alpha/2, n-1} + t_{power, n-1}) s / sqrt(n) of paired differences (std s, n pairs):
    the smallest true mean difference a two-sided paired t-test at level ``alpha`` detects with
    probability ``power`` when the differences vary as observed."""
    d = np.asarray(differences, dtype=float)
    if d.ndim != 1 or d.size < 2 or not np.all(np.isfinite(d)):
        raise StatsError(f"minimum_detectable_difference: need >= 2 finite paired differences, got {d.size}")
    n = d.size
    t = stats.t.ppf(1 - alpha / 2, n - 1) + stats.t.ppf(power, n - 1)
    return float(t * d.std(ddof=1) / np.sqrt(n))


def seeds_needed(differences: Sequence[float], target: float, *, alpha: float = 0.05, power: float = 0.8,
                 most: int = 1000) -> int | None:
    """The smallest number of paired seeds n >= 2 whose MDE, (t_{1-alpha/2, n-1} + t_{power, n-1}) s / sqrt(n)
    with s the observed std of the paired differences, is at most ``target`` (None: more than ``most``)."""
    d = np.asarray(differences, dtype=float)
    if d.ndim != 1 or d.size < 2 or not np.all(np.isfinite(d)):
        raise StatsError(f"seeds_needed: need >= 2 finite paired differences, got {d.size}")
    if not target > 0:
        raise StatsError(f"seeds_needed: the target difference must be > 0, got {target}")
    s = d.std(ddof=1)
    if s == 0:
        return 2
    n = np.arange(2, most + 1)
    mde = (stats.t.ppf(1 - alpha / 2, n - 1) + stats.t.ppf(power, n - 1)) * s / np.sqrt(n)
    hit = np.flatnonzero(mde <= target)
    return int(n[hit[0]]) if hit.size else None


def improvement_p_value(x: Sequence[float], y: Sequence[float]) -> float:
    """Two-sided Mann-Whitney U p-value of H0: P(X > Y) + 0.5 P(X = Y) = 1/2 (exact when it can be)."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if xs.size < 1 or ys.size < 1:
        raise StatsError("improvement_p_value: need at least one value on each side")
    return float(stats.mannwhitneyu(xs, ys, alternative="two-sided", method="auto").pvalue)
