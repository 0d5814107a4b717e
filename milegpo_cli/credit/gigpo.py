"""GiGPO: episode advantage plus anchor-state step advantage (docs/algorithms.md, "GRPO and GiGPO"; verl-agent)."""
from __future__ import annotations

import numpy as np

from .anchors import config_anchors
from .batch import RolloutBatch
from .config import CreditConfig
from .grpo import episode_advantage, group_stats, invalid_penalty, normalise
from .result import CreditResult, make_result


def discounted_returns(reward: np.ndarray, offset: np.ndarray, length: np.ndarray, gamma: float) -> np.ndarray:
    """G_{i,t} = sum_{k>=t} gamma^{k-t} r_{i,k}, by a reverse sweep over t vectorised across rollouts."""
    out = reward.astype(np.float64, copy=True)
    if out.size == 0:
        return out
    order = np.argsort(-length, kind="stable")  # longest first: rollouts alive at t are a prefix
    alive = np.cumsum(np.bincount(length, minlength=int(length.max()) + 1)[::-1])[::-1]  # alive[t] = #len >= t
    start = offset[order]
    for t in range(int(length.max()) - 2, -1, -1):
        idx = start[: alive[t + 2]] + t  # rollouts with a step t + 1
        out[idx] += gamma * out[idx + 1]
    return out


def step_returns(batch: RolloutBatch, config: CreditConfig) -> np.ndarray:
    """G_{i,t}, less ``invalid_penalty`` on a flagged row (verl-agent subtracts it from the row's
    already discounted return, so it does not reach earlier steps)."""
    return discounted_returns(batch.reward, batch.offset, batch.length, config.gamma) - invalid_penalty(batch, config)


def anchor_normalise(values: np.ndarray, anchor: np.ndarray, num_anchors: int, config: CreditConfig) -> np.ndarray:
    """Normalise per anchor group (``anchors.step_anchors``); singleton -> 0."""
    n, mean, std = group_stats(values, anchor, num_anchors, config.std_unbiased)
    std[n <= 1] = 1.0
    return normalise(values, mean[anchor], std[anchor], config.step_norm, config.eps)


def centre(x: np.ndarray, ids: np.ndarray, num_ids: int, groups: np.ndarray, num_groups: int) -> np.ndarray:
    """x minus its mean over the anchor group (``ids``); over the rollout group for a singleton anchor.

    The centring of the MileGPO credits: a group of identical rollouts gets 0 everywhere."""
    count = np.bincount(ids, minlength=num_ids)
    mean = np.bincount(ids, weights=x, minlength=num_ids) / np.maximum(count, 1)
    g_mean = np.bincount(groups, weights=x, minlength=num_groups) / np.maximum(np.bincount(groups, minlength=num_groups), 1)
    return x - np.where(count[ids] >= 2, mean[ids], g_mean[groups])


def gigpo(batch: RolloutBatch, config: CreditConfig, drop: frozenset = frozenset()) -> CreditResult:
    """A_{i,t} = A^E_i + omega * A^S_{i,t}, A^S = anchor-normalised discounted return."""
    rollout_adv, episode_step = episode_advantage(batch, config)
    step_adv = anchor_normalise(step_returns(batch, config), *config_anchors(batch, config), config)
    return make_result(batch.num_steps, episode_step, rollout_adv, step_adv, config.omega)
