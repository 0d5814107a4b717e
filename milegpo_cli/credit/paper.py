"""MileGPO, the paper's construction as docs/algorithms.md reads it (``formulation="paper"``).

Our exact reading (docs/algorithms.md):
    S_m(v) = w_s max(p+(v) - p̄, 0) + w_m n+(v)/N+ + w_c deg(v)/max_group deg
    S_t(v) = w_f max(p̄ - p+(v), 0) + w_l (n-(v)/N-) (revisits of v in failed rollouts / their visits)
    PCC, per credited entry e = (u, a) -> v:   b(e) = sr(u, a) - mean of sr over the sibling actions at u
        psi(e) = alpha_d clip(d(u) - d(v), -1, 1) + alpha_s (p+(v) - p̄) - alpha_f S̄_t(v)
        E(v) = mean_e [w_bc b(e) + w_pg psi(e)];  agreement A = +E (milestone) / -E (trap)
        kept (A >= 0): S <- S (1 + w_pcc A);  rejected: S <- paper.reject * S
    S̄ = S / max over the group's candidates of that kind;  Phi(s) = max_v S̄(v) omega ** d(s, v)
    delta+ = max(gamma_Phi w+ Phi+(s') - w+ Phi+(s), 0),  delta- likewise with w-, Phi-
    credit = c lambda (delta+ - delta-),   r_mix = c gamma_G ** d(s') + credit
    A = A^E + omega [Â_G + eta (Â_mix - Â_G)]   (Â: anchor-normalised; eta = 0 is GraphGPO exactly)
Bounds: S̄, Phi in [0, 1]; credit in [-c lambda gamma_Phi w-, c lambda gamma_Phi w+].
"""
from __future__ import annotations

import numpy as np

from .anchors import config_anchors
from .batch import RolloutBatch
from .config import CreditConfig
from .evidence import branch_evidence, discover, entry_steps, progress_verdict, state_evidence
from .gigpo import anchor_normalise
from .graph import build_graph, decayed_max
from .graphgpo import graph_return
from .grpo import episode_advantage
from .result import Candidate, CreditResult, make_result


def _group_max_normalise(score: np.ndarray, groups: np.ndarray, num_groups: int) -> np.ndarray:
    top = np.zeros(num_groups)
    np.maximum.at(top, groups, score)
    return np.where(top[groups] > 0, score / np.where(top[groups] > 0, top[groups], 1.0), 0.0)


def candidate_scores(batch, graph, ev, milestone, trap, config):
    """Milestone score S_m and trap score S_t per state (0 off the candidate sets)."""
    s, grp = batch.num_states, batch.state_group
    visitors = np.maximum(ev.n_pos + ev.n_neg, 1)
    p_pos, p_bar = ev.n_pos / visitors, ev.base_rate(grp)
    n_pos_g = np.maximum(ev.group_pos[grp], 1)
    n_neg_g = np.maximum(ev.group_n[grp] - ev.group_pos[grp], 1)
    edges = np.unique(batch.step_state * graph.num_nodes + graph.next_node)
    degree = (np.bincount(edges // graph.num_nodes, minlength=graph.num_nodes)
              + np.bincount(edges % graph.num_nodes, minlength=graph.num_nodes))[:s].astype(float)
    norm_degree = _group_max_normalise(degree, grp, batch.num_groups)
    revisit = np.where(ev.fail_visits > 0, (ev.fail_visits - ev.n_neg) / np.maximum(ev.fail_visits, 1), 0.0)
    s_m = (config.paper.w_s * np.maximum(p_pos - p_bar, 0) + config.paper.w_m * ev.n_pos / n_pos_g
           + config.paper.w_c * norm_degree)
    s_t = config.paper.w_f * np.maximum(p_bar - p_pos, 0) + config.paper.w_l * (ev.n_neg / n_neg_g) * revisit
    return np.where(milestone, s_m, 0.0), np.where(trap, s_t, 0.0), p_pos, p_bar


def milegpo_paper(batch: RolloutBatch, config: CreditConfig, drop: frozenset) -> CreditResult:
    graph = build_graph(batch, config.graph_final == "observed")
    ev = state_evidence(batch, graph)
    s, grp, g = batch.num_states, batch.state_group, batch.num_groups
    milestone, trap = discover(ev, grp, config.m_min)
    if "milestones" in drop:
        milestone[:] = False
    if "traps" in drop:
        trap[:] = False
    s_m, s_t, p_pos, p_bar = candidate_scores(batch, graph, ev, milestone, trap, config)

    # PCC evidence on each credited entry (u, a) -> v
    success_rate = branch_evidence(batch, batch.step_success.astype(float))
    pair_sr = np.zeros(success_rate.num_pairs)
    pair_sr[success_rate.pair] = success_rate.q
    sum_sr = np.bincount(success_rate.pair_state, weights=pair_sr, minlength=s)
    n_sib = np.bincount(success_rate.pair_state, minlength=s)[batch.step_state] - 1
    b = np.where(n_sib > 0, success_rate.q - (sum_sr[batch.step_state] - success_rate.q) / np.maximum(n_sib, 1), 0.0)
    d = graph.distance
    du, dv = d[batch.step_state], d[graph.next_node]
    with np.errstate(invalid="ignore"):  # inf - inf: neither end reaches SUCCESS -> 0
        delta_d = np.clip(np.nan_to_num(du - dv, nan=0.0, posinf=1.0, neginf=-1.0), -1.0, 1.0)
    target = np.where(graph.next_node < s, graph.next_node, 0)
    trap_evidence = _group_max_normalise(s_t, grp, g)[target]
    psi = (config.paper.alpha_d * delta_d + config.paper.alpha_s * (p_pos - p_bar)[target]
           - config.paper.alpha_f * trap_evidence)
    evidence = (0.0 if "same-state" in drop else config.paper.w_bc * b) + (0.0 if "progress" in drop else config.paper.w_pg * psi)
    evidence = np.broadcast_to(evidence, (batch.num_steps,))
    entry = entry_steps(batch, graph)
    cand_step = entry & (milestone | trap)[target]
    n_entry = np.maximum(np.bincount(target[cand_step], minlength=s), 1)
    e_v = np.bincount(target[cand_step], weights=evidence[cand_step], minlength=s) / n_entry
    agree = np.where(milestone, e_v, -e_v)
    factor = np.where(agree >= 0, 1.0 + config.paper.w_pcc * agree, config.paper.reject)
    s_m, s_t = s_m * factor, s_t * factor
    if "reliability" in drop:  # no outcome calibration: every kept candidate at full strength
        s_m, s_t = np.where(s_m > 0, 1.0, 0.0), np.where(s_t > 0, 1.0, 0.0)
    bar_m, bar_t = _group_max_normalise(s_m, grp, g), _group_max_normalise(s_t, grp, g)

    # RCS potentials and one-sided increments
    def potential(value):
        full = np.zeros(graph.num_nodes)
        full[:s] = value
        return decayed_max(batch.step_state, graph.next_node, graph.num_nodes, full, config.paper.omega)

    phi_p, phi_m = potential(bar_m), potential(bar_t)
    u, v = batch.step_state, graph.next_node
    inc_p = np.maximum(config.paper.gamma_phi * config.paper.w_plus * phi_p[v] - config.paper.w_plus * phi_p[u], 0)
    inc_m = np.maximum(config.paper.gamma_phi * config.paper.w_minus * phi_m[v] - config.paper.w_minus * phi_m[u], 0)
    credit = config.graph_c * config.paper.lambda_ * (inc_p - inc_m)

    r_g = graph_return(graph, config.graph_c, config.graph_gamma)
    anchors = config_anchors(batch, config)
    a_g = anchor_normalise(r_g, *anchors, config)
    a_mix = anchor_normalise(r_g + credit, *anchors, config)
    step_adv = a_g + config.paper.eta * (a_mix - a_g)
    rollout_adv, episode_step = episode_advantage(batch, config)

    kept_m, kept_t = bar_m > 0, bar_t > 0
    ms_step, tr_step = entry & kept_m[target], entry & kept_t[target]
    kept_step = ms_step | tr_step
    psi_ok = np.where(ms_step, psi > 0, psi <= 0)
    b_ok = np.where(ms_step, b > 0, b < 0)
    has_sib = n_sib > 0

    def share(mask, where):
        n = np.bincount(target[where], minlength=s)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, np.bincount(target[where & mask], minlength=s) / np.maximum(n, 1), np.nan)

    p_share, b_share = share(psi_ok, kept_step), share(b_ok, kept_step & has_sib)
    n_kept = np.maximum(np.bincount(target[kept_step], minlength=s), 1)
    mean_credit = np.bincount(target[kept_step], weights=credit[kept_step], minlength=s) / n_kept
    candidates = [
        Candidate(group=batch.group_names[grp[x]], key=batch.state_keys[x],
                  kind="milestone" if kept_m[x] else "trap", n_pos=int(ev.n_pos[x]), n_neg=int(ev.n_neg[x]),
                  rho=float(bar_m[x] if kept_m[x] else -bar_t[x]), distance=float(d[x]),
                  progress_ok=float(p_share[x]) if "progress" not in drop else float("nan"),
                  branch_ok=float(b_share[x]) if "same-state" not in drop else float("nan"),
                  credit=float(mean_credit[x]))
        for x in np.flatnonzero(kept_m | kept_t)
    ]
    return make_result(batch.num_steps, episode_step, rollout_adv, step_adv, config.omega,
                       credit=credit, milestone=ms_step, trap=tr_step, unverified=kept_step & ~has_sib,
                       progress=progress_verdict(batch, graph, ev), branch=branch_evidence(batch).sign,
                       candidates=candidates)
