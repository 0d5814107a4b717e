"""What an estimator returns: per-step advantage parts and flags, per-group candidate sets."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple

import numpy as np


class Candidate(NamedTuple):
    """A milestone or trap of one group (v3, v2 and paper formulations: docs/algorithms.md).

    ``rho``: reliability in [-1, 1] (ours) or the signed normalised score +-S(v) (paper).
    ``distance``: graph distance to SUCCESS (inf if unreachable).
    ``progress_ok`` / ``branch_ok``: share of the candidate's credited entries that pass the
    progress gate / the same-state branch test (NaN where the test was dropped or never applied).
    ``credit``: mean shaping credit given per credited entry.
    """

    group: str
    key: str
    kind: str  # "milestone" | "trap"
    n_pos: int
    n_neg: int
    rho: float
    distance: float
    progress_ok: float
    branch_ok: float
    credit: float


@dataclass(frozen=True, eq=False)
class CreditResult:
    """Per flattened step (float64 / bool / int8 arrays of length num_steps) and per rollout.

    ``advantage = episode_advantage + omega * step_advantage``; ``credit`` is the calibrated
    (ours) or shaping (paper) credit already contained in ``step_advantage``.
    ``progress``: +1 the step's transition shortens the distance to SUCCESS, -1 it does not,
    0 n/a (group without success, or not computed). ``branch``: sign(Q(u, a) - V(u)) where the
    group shows >= 2 distinct actions at u, else 0. ``unverified``: a candidate entered at this
    step had no alternative action at u (branch test neutral).
    """

    advantage: np.ndarray
    episode_advantage: np.ndarray
    step_advantage: np.ndarray
    credit: np.ndarray
    milestone: np.ndarray
    trap: np.ndarray
    unverified: np.ndarray
    progress: np.ndarray
    branch: np.ndarray
    rollout_advantage: np.ndarray  # A^E_i per rollout (also defined for zero-length rollouts)
    candidates: list[Candidate] = field(default_factory=list)
    memory: Mapping[str, Any] | None = None  # MileGPO v3 with credit.memory: the memory after this batch (credit/memory.py)


def make_result(num_steps: int, episode_step: np.ndarray, rollout_adv: np.ndarray, step_adv: np.ndarray,
                omega: float, **parts) -> CreditResult:
    """Assemble a result; parts not given are zeros / False."""
    zeros = np.zeros(num_steps)
    return CreditResult(
        advantage=episode_step + omega * step_adv,
        episode_advantage=episode_step,
        step_advantage=step_adv,
        credit=parts.get("credit", zeros),
        milestone=parts.get("milestone", np.zeros(num_steps, bool)),
        trap=parts.get("trap", np.zeros(num_steps, bool)),
        unverified=parts.get("unverified", np.zeros(num_steps, bool)),
        progress=parts.get("progress", np.zeros(num_steps, np.int8)),
        branch=parts.get("branch", np.zeros(num_steps, np.int8)),
        rollout_advantage=rollout_adv,
        candidates=parts.get("candidates", []),
        memory=parts.get("memory"),
    )
