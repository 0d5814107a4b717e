"""GRPO: episode-level group-relative advantage (docs/algorithms.md; verl-agent ``episode_norm_reward``)."""
from __future__ import annotations

import numpy as np

from .batch import RolloutBatch
from .config import CreditConfig
from .result import CreditResult, make_result


def group_stats(values: np.ndarray, groups: np.ndarray, num_groups: int, unbiased: bool):
    """Count, mean and standard deviation of ``values`` per group id (two-pass, vectorised).

    Deviations are divided by their group's largest |deviation| before squaring, so the sum of
    squares cannot overflow for any finite input (batch.MAX_MAGNITUDE bounds the values). The mean
    of a group whose values are all equal is that value exactly, so every deviation in it is exactly
    0 (summing and dividing can leave a rounding residue that normalising would blow up).
    """
    n = np.bincount(groups, minlength=num_groups)
    mean = np.bincount(groups, weights=values, minlength=num_groups) / np.maximum(n, 1)
    low, high = np.full(num_groups, np.inf), np.full(num_groups, -np.inf)
    np.minimum.at(low, groups, values)
    np.maximum.at(high, groups, values)
    equal = (n > 0) & (low == high)
    mean[equal] = low[equal]
    dev = values - mean[groups]
    scale = np.zeros(num_groups)
    np.maximum.at(scale, groups, np.abs(dev))
    scale[scale == 0] = 1.0
    unit = dev / scale[groups]
    ss = np.bincount(groups, weights=unit * unit, minlength=num_groups)
    std = scale * np.sqrt(ss / np.maximum(n - int(unbiased), 1))
    return n, mean, std


def normalise(x: np.ndarray, mean: np.ndarray, std: np.ndarray, norm: str, eps: float) -> np.ndarray:
    """``(x - mean) / (std + eps)`` (mean_std) or ``x - mean`` (mean)."""
    return (x - mean) / (std + eps) if norm == "mean_std" else x - mean


def episode_score(batch: RolloutBatch, config: CreditConfig) -> np.ndarray:
    """R_i per rollout: ``episode_scale`` x (the outcome, or the success indicator)."""
    base = batch.outcome if config.episode_score == "outcome" else batch.success.astype(np.float64)
    return config.episode_scale * base


def invalid_penalty(batch: RolloutBatch, config: CreditConfig) -> np.ndarray:
    """Per step row: ``invalid_penalty`` where the step is flagged invalid, else 0 (verl-agent)."""
    if config.invalid_penalty == 0 or batch.step_invalid is None:
        return np.zeros(batch.num_steps)
    return config.invalid_penalty * batch.step_invalid


def episode_advantage(batch: RolloutBatch, config: CreditConfig) -> tuple[np.ndarray, np.ndarray]:
    """A^E = (R - mean_g R) / (std_g R + eps): (per rollout, per step row).

    Statistics over the rollouts of the group (``episode_stats="rollouts"``) or over its step rows
    (``"steps"``, verl-agent's default). A group with a single entry has mean 0 and std 1, as in
    verl-agent (so its advantage is the raw scaled outcome). A step row flagged invalid scores
    R_i - invalid_penalty (verl-agent subtracts it from that row's token-level score) under ``"steps"``,
    where the penalised rows make the statistics; under ``"rollouts"`` the penalty is taken off the
    row's normalised advantage instead, A^E_i - invalid_penalty: dividing it by a std it took no part
    in would give -p / eps = -1e5 in a group of equal scores. The per-rollout value is the unpenalised one.
    """
    score = episode_score(batch, config)
    penalty = invalid_penalty(batch, config)
    g, sg = batch.rollout_group, batch.step_group
    if config.episode_stats == "rollouts":
        n, mean, std = group_stats(score, batch.rollout_group, batch.num_groups, config.std_unbiased)
        singleton_defaults(n, mean, std)
        rollout_adv = normalise(score, mean[g], std[g], config.episode_norm, config.eps)
        return rollout_adv, rollout_adv[batch.step_rollout] - penalty
    row = score[batch.step_rollout] - penalty
    n, mean, std = group_stats(row, batch.step_group, batch.num_groups, config.std_unbiased)
    singleton_defaults(n, mean, std)
    return (normalise(score, mean[g], std[g], config.episode_norm, config.eps),
            normalise(row, mean[sg], std[sg], config.episode_norm, config.eps))


def singleton_defaults(n: np.ndarray, mean: np.ndarray, std: np.ndarray) -> None:
    """A group with a single entry: mean 0, std 1 (verl-agent), in place."""
    single = n <= 1
    mean[single], std[single] = 0.0, 1.0


def grpo(batch: RolloutBatch, config: CreditConfig, drop: frozenset = frozenset()) -> CreditResult:
    """A_{i,t} = A^E_i (GRPO is the omega = 0 case of A = A^E + omega A^S, docs/algorithms.md)."""
    rollout_adv, step_adv = episode_advantage(batch, config)
    return make_result(batch.num_steps, step_adv, rollout_adv, np.zeros(batch.num_steps), 0.0)
