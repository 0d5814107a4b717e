"""MileGPO v3 (``formulation="v3"``, the default; docs/algorithms.md "MileGPO v3" gives the reasons).

Per step t of rollout i, transition u -> v (v = s_{t+1}, or SUCCESS / FAIL after the last step):

    pi_t   = +1 if d(v) < d(u),  -1 if d(u) < inf and d(v) >= d(u),  0 if d(u) = inf (progress silent)
    x_t    = lambda_p pi_t
           + [t first enters v, v in M] lambda_m w_M(v) g_p^[pi_t < 0] g_b^[beta_t < 0]
           - [u in T, rollout i returns to u after t] lambda_t w_T(u) g_p^[pi_t > 0] g_b^[beta_t > 0]
    c_t    = x_t - mean of x over t's anchor group (by default: k-th visit of the same state)
             (a singleton anchor group: minus the mean of x over the steps of its rollout group)
    A^S    = anchor-normalised G_{i,t} + c_t
    A      = A^E_i + omega A^S

Candidates are selected by support alone: M = non-initial states visited by >= min(m_min, N+)
successful rollouts; T = states visited by >= 2 failed rollouts or revisited within one (credited
event: a step from v that its rollout later returns to, i.e. the start of a loop).
They are weighted by signed reliabilities in [-1, 1] (``reliability``): w_M = rho_out(v), the
Beta-posterior P(p_v > p̄) mapped to [-1, 1]; w_T = the mean of the available trap evidences,
-rho_out(v) (outcome, needs 0 < p̄ < 1) and rho_rec(v) (recurrence: P(r_v > r̄) for the share r_v of
failed-rollout visits of v that are repeats, prior centred on the group's share r̄; needs a failed
rollout). beta_t = sign(Q(u, a_t) - V(u)) where the group shows >= 2 actions at u, else 0; a tie is 0.
Gates scale (g in [0, 1]); they never apply to a silent test.
With ``credit.memory`` the counts n+, n-, N, N+ and the graph behind d include what the task's earlier
iterations showed (credit/memory.py); counts are then real numbers and "N+ >= 1" reads "N+ > 0".
"""
from __future__ import annotations

import numpy as np

from .anchors import config_anchors
from .batch import RolloutBatch
from .config import CreditConfig
from .evidence import branch_evidence, entry_steps, state_evidence
from .gigpo import anchor_normalise, centre, step_returns
from .graph import build_graph, revisited_later
from .grpo import episode_advantage
from .memory import Memory, recall, with_recall
from .milegpo import reliability
from .result import Candidate, CreditResult, make_result


def signed_reliability(successes: np.ndarray, failures: np.ndarray, base: np.ndarray, k: float) -> np.ndarray:
    """rho = 2 P(p > base) - 1 under Beta(k base + successes, k (1 - base) + failures); 0 where base is 0 or 1."""
    out = np.zeros(successes.shape)
    ok = (base > 0) & (base < 1)
    out[ok] = reliability(successes[ok], failures[ok], base[ok], k)
    return out


def progress_signal(batch: RolloutBatch, distance: np.ndarray, next_node: np.ndarray) -> np.ndarray:
    """pi_t in {-1, 0, +1} (int8): 0 where SUCCESS is not reachable from u in the group graph."""
    du, dv = distance[batch.step_state], distance[next_node]
    return np.where(np.isinf(du), 0, np.where(dv < du, 1, -1)).astype(np.int8)


def milegpo_v3(batch: RolloutBatch, config: CreditConfig, drop: frozenset, memory: Memory | None = None) -> CreditResult:
    graph = build_graph(batch, config.graph_final == "observed")
    ev = state_evidence(batch, graph)
    new_memory = None
    if config.memory and "memory" not in drop:  # counts and graph plus what the task's earlier iterations showed
        recalled, new_memory = recall(memory or {}, batch, graph, ev, config.memory_decay, config.memory_floor,
                                      config.memory_states)
        graph, ev = with_recall(batch, graph, ev, recalled)
    s_count, n, grp, k = batch.num_states, batch.num_steps, batch.state_group, config.prior_strength

    # Candidates by support
    pos_g = ev.group_pos[grp]
    repeats = ev.fail_visits - ev.n_neg
    milestone = ~ev.initial & (pos_g > 0) & (ev.n_pos > 0) & (ev.n_pos >= np.minimum(config.m_min, pos_g))
    trap = (ev.n_neg >= 2) | (repeats > 0)  # the initial state too: the credited step leaves it
    if "milestones" in drop:
        milestone[:] = False
    if "traps" in drop:
        trap[:] = False

    # Weights by reliability: outcome evidence (milestones, traps) and recurrence evidence (traps)
    p_bar = ev.base_rate(grp)
    rho_out = signed_reliability(ev.n_pos, ev.n_neg, p_bar, k)
    fail_visits_g = np.bincount(grp, weights=ev.fail_visits, minlength=batch.num_groups)
    r_bar = (np.bincount(grp, weights=repeats, minlength=batch.num_groups) / np.maximum(fail_visits_g, 1))[grp]
    rho_rec = signed_reliability(repeats, ev.n_neg, r_bar, k)
    has_out, has_rec = (p_bar > 0) & (p_bar < 1), (r_bar > 0) & (r_bar < 1)
    w_trap = (np.where(has_out, -rho_out, 0.0) + np.where(has_rec, rho_rec, 0.0)) / np.maximum(has_out + has_rec, 1)
    w_ms = rho_out
    if "reliability" in drop:
        w_ms, w_trap = np.ones(s_count), np.ones(s_count)

    # Local progress and same-state evidence
    use_progress = "progress" not in drop
    progress = progress_signal(batch, graph.distance, graph.next_node)
    branch = branch_evidence(batch)
    beta = branch.sign if "same-state" not in drop else np.zeros(n, np.int8)
    pi = progress if use_progress else np.zeros(n, np.int8)

    # Credited events: the first entry of a milestone; a step from a trap that the rollout comes back to
    target = np.where(graph.next_node < s_count, graph.next_node, 0)
    ms_at = np.flatnonzero(entry_steps(batch, graph) & milestone[target])
    tr_at = np.flatnonzero(revisited_later(batch) & trap[batch.step_state])
    ms_gate = np.where(pi[ms_at] < 0, config.g_p, 1.0) * np.where(beta[ms_at] < 0, config.g_b, 1.0)
    tr_gate = np.where(pi[tr_at] > 0, config.g_p, 1.0) * np.where(beta[tr_at] > 0, config.g_b, 1.0)
    ms_credit = config.lambda_m * w_ms[target[ms_at]] * ms_gate
    tr_credit = -config.lambda_t * w_trap[batch.step_state[tr_at]] * tr_gate
    x = config.lambda_p * pi.astype(np.float64)
    np.add.at(x, ms_at, ms_credit)
    np.add.at(x, tr_at, tr_credit)

    # Centring and advantage
    anchor, num_anchors = config_anchors(batch, config)
    credit = centre(x, anchor, num_anchors, batch.step_group, batch.num_groups)
    rollout_adv, episode_step = episode_advantage(batch, config)
    step_adv = anchor_normalise(step_returns(batch, config), anchor, num_anchors, config) + credit

    candidates = (_candidates(batch, graph, ev, "milestone", milestone, w_ms, ms_at, target, ms_credit,
                              pi[ms_at] < 0, beta[ms_at], 1, use_progress, "same-state" not in drop)
                  + _candidates(batch, graph, ev, "trap", trap, -w_trap, tr_at, batch.step_state, tr_credit,
                                pi[tr_at] > 0, beta[tr_at], -1, use_progress, "same-state" not in drop))
    flags = np.zeros((3, n), dtype=bool)
    flags[0, ms_at], flags[1, tr_at] = True, True
    flags[2, np.concatenate([ms_at, tr_at])] = beta[np.concatenate([ms_at, tr_at])] == 0
    return make_result(n, episode_step, rollout_adv, step_adv, config.omega, credit=credit,
                       milestone=flags[0], trap=flags[1], unverified=flags[2], progress=progress,
                       branch=branch.sign, candidates=candidates, memory=new_memory)


def _candidates(batch, graph, ev, kind, mask, weight, at, state, credit, progress_against, beta, sign,
                use_progress, use_branch) -> list[Candidate]:
    """One record per credited candidate: counts, signed weight, shares of entries passing each test."""
    s = batch.num_states
    v = state[at]
    entries = np.bincount(v, minlength=s)
    states = np.flatnonzero(mask & (entries > 0))

    def mean(values, where=None):
        w = np.ones(at.size, bool) if where is None else where
        num = np.bincount(v[w], minlength=s)[states]
        tot = np.bincount(v[w], weights=np.asarray(values, float)[w], minlength=s)[states]
        return np.divide(tot, num, out=np.full(states.size, np.nan), where=num > 0)

    nan = np.full(states.size, np.nan)
    progress_ok = mean(~progress_against) if use_progress else nan
    branch_ok = mean(beta == sign, beta != 0) if use_branch else nan
    return [Candidate(batch.group_names[batch.state_group[x]], batch.state_keys[x], kind, int(ev.n_pos[x]),
                      int(ev.n_neg[x]), float(weight[x]), float(graph.distance[x]), float(p), float(b), float(c))
            for x, p, b, c in zip(states.tolist(), progress_ok.tolist(), branch_ok.tolist(), mean(credit).tolist())]
