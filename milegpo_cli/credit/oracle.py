"""Oracle milestones (BEACON-style reference, docs/algorithms.md; diagnostics only): the environment's true
subgoals used as milestones, i.e. what perfect milestone discovery could give.

    m_{i,t} = R_ms x (true subgoals newly reached at step t)      (R_ms = lambda_m x graph_c)
    A^S     = norm_A(G_{i,t} + sum_{k >= t} gamma^{k-t} m_{i,k})    (decays towards each milestone)
    A       = A^E_i + omega A^S

Needs ``Rollout.subgoals`` on every rollout (recordings of bench/credit_diagnostics.py carry them).
"""
from __future__ import annotations

from .anchors import config_anchors
from .batch import CreditError, RolloutBatch
from .config import CreditConfig
from .gigpo import anchor_normalise, discounted_returns, step_returns
from .grpo import episode_advantage
from .result import CreditResult, make_result


def oracle_milestones(batch: RolloutBatch, config: CreditConfig, drop: frozenset = frozenset()) -> CreditResult:
    if not batch.has_subgoals:
        raise CreditError("subgoals: oracle-milestones needs the true subgoals of every step (Rollout.subgoals)")
    shaped = config.lambda_m * config.graph_c * batch.step_subgoals.astype(float)
    milestone_return = discounted_returns(shaped, batch.offset, batch.length, config.gamma)
    anchors = config_anchors(batch, config)
    returns = step_returns(batch, config)
    base = anchor_normalise(returns, *anchors, config)
    step_adv = anchor_normalise(returns + milestone_return, *anchors, config)
    rollout_adv, episode_step = episode_advantage(batch, config)
    return make_result(batch.num_steps, episode_step, rollout_adv, step_adv, config.omega, credit=step_adv - base,
                       milestone=batch.step_subgoals > 0)
