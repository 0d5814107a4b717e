"""Groups of identical rollouts (docs/algorithms.md, "Anchor groups and centring"): every rollout of the group has
the same states, actions, rewards, invalid flags, outcome and success (a group of one rollout included). Such a
group compares nothing, so with ``zero_identical`` every estimator gives its steps advantage 0, loops included,
whatever the anchor groups (verl-agent instead gives a single rollout its raw score: mean 0, std 1)."""
from __future__ import annotations

import numpy as np

from .batch import RolloutBatch
from .result import CreditResult


def identical_groups(batch: RolloutBatch) -> np.ndarray:
    """Per group: all of its rollouts are identical (true for a single rollout)."""
    first: dict[int, tuple] = {}
    same = np.ones(batch.num_groups, dtype=bool)
    invalid = batch.step_invalid if batch.step_invalid is not None else np.zeros(batch.num_steps, bool)
    for r in range(batch.num_rollouts):
        g = int(batch.rollout_group[r])
        if not same[g]:
            continue
        s = slice(batch.offset[r], batch.offset[r] + batch.length[r])
        sig = (batch.outcome[r]  # state and action ids are interned per group: equal ids, equal keys
               , batch.success[r], batch.step_state[s].tobytes(), batch.step_action[s].tobytes(),
               batch.reward[s].tobytes(), invalid[s].tobytes())
        same[g] = first.setdefault(g, sig) == sig
    return same


def zero_identical_groups(batch: RolloutBatch, result: CreditResult) -> CreditResult:
    """``result`` with every step (and rollout) of an identical group set to 0."""
    groups = identical_groups(batch)
    if not groups.any():
        return result
    steps, rollouts = groups[batch.step_group], groups[batch.rollout_group]
    out = {name: np.where(steps, 0.0, getattr(result, name))
           for name in ("advantage", "episode_advantage", "step_advantage", "credit")}
    return CreditResult(**{**result.__dict__, **out,
                           "rollout_advantage": np.where(rollouts, 0.0, result.rollout_advantage)})
