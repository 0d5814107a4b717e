"""Share of same-state ties (docs/algorithms.md, "GraphGPO": the ties the paper reports MileGPO breaks)."""
from __future__ import annotations

import numpy as np

from .batch import RolloutBatch


def _pairs(key: np.ndarray) -> int:
    _, n = np.unique(key, return_counts=True)
    return int((n * (n - 1) // 2).sum())


def same_state_tie_share(batch: RolloutBatch, step_advantage: np.ndarray, decimals: int = 9) -> float:
    """Fraction of step pairs (same group, same state key, distinct actions) whose advantages are equal.

    Counted without enumerating pairs: pairs(u) - pairs(u, a) over all steps, and the same over
    steps with equal (rounded) advantage. NaN when the batch has no such pair.
    """
    adv = np.asarray(step_advantage, dtype=np.float64)
    if adv.shape != (batch.num_steps,):
        raise ValueError(f"step_advantage: expected shape ({batch.num_steps},), got {adv.shape}")
    _, level = np.unique(np.round(adv, decimals) + 0.0, return_inverse=True)
    s = batch.step_state
    a = batch.step_action
    na = max(len(batch.action_names), 1)
    nl = int(level.max()) + 1 if level.size else 1
    distinct = _pairs(s) - _pairs(s * na + a)
    if distinct == 0:
        return float("nan")
    tied = _pairs(s * nl + level) - _pairs((s * na + a) * nl + level)
    return tied / distinct
