"""MileGPO v2 (``formulation="v2"``, formerly "ours"; docs/algorithms.md): Milestone Discovery,
Reliability-Calibrated Shaping (RCS), Progress-Contrastive Calibration (PCC), immediate calibrated
credit in the step advantage.

    c_t   = p(u -> v) + [v a candidate first entered at t] * b(v) * gate_progress * gate_branch
    A^S   = anchor-normalised G_{i,t} + c_t
    A     = A^E_i + omega * A^S
"""
from __future__ import annotations

import numpy as np
from scipy.special import betainc

from .anchors import config_anchors
from .batch import RolloutBatch
from .config import CreditConfig
from .evidence import branch_evidence, discover, entry_steps, progress_verdict, state_evidence
from .gigpo import anchor_normalise, centre, step_returns
from .graph import build_graph
from .grpo import episode_advantage
from .result import Candidate, CreditResult, make_result


def reliability(n_pos: np.ndarray, n_neg: np.ndarray, p_bar: np.ndarray, k: float) -> np.ndarray:
    """RCS: rho(v) = 2 P(p_v > p̄) - 1 under the posterior Beta(k p̄ + n+, k (1 - p̄) + n-). Needs 0 < p̄ < 1."""
    return 1.0 - 2.0 * betainc(k * p_bar + n_pos, k * (1.0 - p_bar) + n_neg, p_bar)


def milegpo_v2(batch: RolloutBatch, config: CreditConfig, drop: frozenset) -> CreditResult:
    graph = build_graph(batch, config.graph_final == "observed")
    ev = state_evidence(batch, graph)
    s_count, n = batch.num_states, batch.num_steps

    # (1) Milestone Discovery
    milestone, trap = discover(ev, batch.state_group, config.m_min)
    if "milestones" in drop:
        milestone[:] = False
    if "traps" in drop:
        trap[:] = False

    # (2) Reliability-Calibrated Shaping: rho(v), b(v) = lambda_m rho (milestone) or lambda_t rho (trap)
    rho = np.zeros(s_count)
    if "reliability" in drop:
        rho[milestone], rho[trap] = 1.0, -1.0
    else:
        cand = milestone | trap
        rho[cand] = reliability(ev.n_pos[cand], ev.n_neg[cand], ev.base_rate(batch.state_group[cand]),
                                config.prior_strength)
        milestone &= rho > 0
        trap &= rho < 0
    cand = milestone | trap
    bonus = np.where(milestone, config.lambda_m * rho, config.lambda_t * rho)

    # (3) Progress-Contrastive Calibration, on the credited entries only (compact index arrays)
    progress = progress_verdict(batch, graph, ev)
    branch = branch_evidence(batch)
    entry = entry_steps(batch, graph)
    target = np.where(graph.next_node < s_count, graph.next_node, 0)
    at = np.flatnonzero(entry & cand[target])  # steps whose transition first enters a candidate
    v = target[at]
    is_m = milestone[v]
    progress_ok = np.where(is_m, progress[at] > 0, progress[at] < 0)
    alternative = branch.alternative[at]
    branch_ok = branch.sign[at] == np.where(is_m, 1, -1)
    gate_p = 1.0 if "progress" in drop else np.where(progress_ok, 1.0, config.g_p)
    same_state = "same-state" not in drop
    gate_b = np.where(alternative & ~branch_ok, config.g_b, 1.0) if same_state else 1.0
    shaped_at = bonus[v] * gate_p * gate_b
    credit = np.zeros(n) if "progress" in drop else config.lambda_p * progress
    credit[at] += shaped_at

    # (4) Advantage: immediate credit added to the anchor-normalised return
    rollout_adv, episode_step = episode_advantage(batch, config)
    anchor, num_anchors = config_anchors(batch, config)
    credit = centre(credit, anchor, num_anchors, batch.step_group, batch.num_groups)
    step_adv = anchor_normalise(step_returns(batch, config), anchor, num_anchors, config) + credit

    def per_candidate(x, mask=None):
        """Mean of x over each candidate's credited entries (restricted to mask); NaN if none."""
        w = np.ones(at.size, bool) if mask is None else mask
        num = np.bincount(v[w], minlength=s_count)[cand]
        tot = np.bincount(v[w], weights=np.asarray(x, float)[w], minlength=s_count)[cand]
        return np.divide(tot, num, out=np.full(num.size, np.nan), where=num > 0)

    nan = np.full(int(cand.sum()), np.nan)
    cols = zip(np.flatnonzero(cand).tolist(), milestone[cand].tolist(), ev.n_pos[cand].tolist(),
               ev.n_neg[cand].tolist(), rho[cand].tolist(), graph.distance[:s_count][cand].tolist(),
               (nan if "progress" in drop else per_candidate(progress_ok)).tolist(),
               (per_candidate(branch_ok, alternative) if same_state else nan).tolist(),
               per_candidate(shaped_at).tolist())
    candidates = [Candidate(batch.group_names[batch.state_group[x]], batch.state_keys[x],
                            "milestone" if m else "trap", *rest) for x, m, *rest in cols]
    flags = np.zeros((3, n), dtype=bool)
    flags[0, at[is_m]] = True
    flags[1, at[~is_m]] = True
    if same_state:
        flags[2, at[~alternative]] = True
    return make_result(n, episode_step, rollout_adv, step_adv, config.omega,
                       credit=credit, milestone=flags[0], trap=flags[1], unverified=flags[2],
                       progress=progress, branch=branch.sign, candidates=candidates)
