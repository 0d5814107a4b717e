"""HGPO, hierarchy-of-groups policy optimisation (arXiv 2602.22817; verl-agent recipe/hgpo core_hgpo.py
``hgpo_advantage_estimate``; docs/algorithms.md, "HGPO").

A step (i, t) belongs to one group per history length k = 1 .. min(K + 1, t + 1): the steps of its task
group whose last k states equal (s_{i,t-k+1}, ..., s_{i,t}). In each group of >= 2 steps its return is
normalised, a^k = (G - mean) / (std + eps) (population std; ``step_norm = "mean"``: G - mean), and

    A_{i,t} = sum_k w_k a^k / (sum_k w_k + eps),  w_k = (k + 1) ** alpha,

over the groups whose a^k is not 0 (0 when there is none). ``hgpo_base_group`` adds the episode
advantage as a k = 0 group. G is the discounted return less the invalid penalty of the row (gigpo).
With ``anchor_visits`` (our default; off in the verl-agent preset) a group also matches the visit count of
its history in the rollout, as GiGPO's anchor groups do.
"""
from __future__ import annotations

import numpy as np

from .anchors import visit_anchors
from .batch import RolloutBatch
from .config import CreditConfig
from .gigpo import step_returns
from .grpo import episode_advantage, group_stats, normalise
from .result import CreditResult, make_result


def history_groups(batch: RolloutBatch, depth: int, visits: bool = False):
    """Yield (k, steps, group id per step, number of groups) for k = 1 .. depth: the steps with t >= k - 1
    keyed by their last k states (state ids are per task group, so keys never cross groups).

    ``visits`` (``anchor_visits``): key by (history, earlier visits of that history in the rollout) as well,
    so that identical rollouts share every group (advantage 0), loops included; the recipe does not.
    """
    n = batch.num_steps
    key = batch.step_state.copy()
    for k in range(1, depth + 1):
        if k > 1:  # key of the last k - 1 states at t, extended by s_{t-k+1}
            prev = np.full(n, -1, dtype=np.int64)
            prev[k - 1:] = batch.step_state[: n - k + 1]
            _, key = np.unique(np.stack([key, prev], axis=1), axis=0, return_inverse=True)
            key = key.reshape(-1)
        short = batch.step_t < k - 1  # no history of length k: a key of their own, never grouped
        key = np.where(short, key.max(initial=0) + 1 + np.arange(n), key)
        ids = visit_anchors(batch, key, int(key.max(initial=0)) + 1)[0] if visits else key
        steps = np.flatnonzero(~short)
        uniq, inverse = np.unique(ids[steps], return_inverse=True)
        yield k, steps, inverse.reshape(-1), uniq.size


def hgpo(batch: RolloutBatch, config: CreditConfig, drop: frozenset = frozenset()) -> CreditResult:
    n = batch.num_steps
    returns = step_returns(batch, config)
    num = np.zeros(n)
    den = np.zeros(n)
    if config.hgpo_base_group:
        _, base = episode_advantage(batch, config)
        used = base != 0
        num += np.where(used, base, 0.0)  # weight (0 + 1) ** alpha = 1
        den += used
    for k, steps, ids, count in history_groups(batch, config.hgpo_history + 1, config.anchor_visits):
        size, mean, std = group_stats(returns[steps], ids, count, unbiased=False)
        a = normalise(returns[steps], mean[ids], std[ids], config.step_norm, config.eps)
        used = (size[ids] >= 2) & (a != 0)
        w = float(k + 1) ** config.hgpo_alpha
        num[steps] += np.where(used, w * a, 0.0)
        den[steps] += np.where(used, w, 0.0)
    step_adv = np.where(den > 0, num / (den + config.eps), 0.0)
    return make_result(n, np.zeros(n), np.zeros(batch.num_rollouts), step_adv, 1.0)
