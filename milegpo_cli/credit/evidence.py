"""Outcome evidence read off the group graph, shared by MileGPO v3 and v2 (docs/algorithms.md).

Per state v: n+(v) / n-(v) = successful / failed rollouts that visit v; per group: N, N+ and the
base rate p̄ = N+ / N; per step: the same-state branch statistics Q(u, a) and V(u), and the local
progress verdict d(v) < d(u).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .batch import RolloutBatch
from .graph import RolloutGraph


@dataclass(frozen=True, eq=False)
class StateEvidence:
    n_pos: np.ndarray  # per state
    n_neg: np.ndarray
    fail_visits: np.ndarray  # visits (with repeats) by failed rollouts
    initial: np.ndarray  # s_0 of some rollout of the group
    group_n: np.ndarray  # per group: N (zero-length rollouts included)
    group_pos: np.ndarray  # per group: N+

    def base_rate(self, groups: np.ndarray) -> np.ndarray:
        return self.group_pos[groups] / np.maximum(self.group_n[groups], 1)


def state_evidence(batch: RolloutBatch, graph: RolloutGraph) -> StateEvidence:
    s, st, succ, fv = batch.num_states, batch.step_state, batch.step_success, graph.first_visit
    initial = np.zeros(s, dtype=bool)
    initial[st[batch.step_t == 0]] = True
    return StateEvidence(
        n_pos=np.bincount(st[fv & succ], minlength=s),
        n_neg=np.bincount(st[fv & ~succ], minlength=s),
        fail_visits=np.bincount(st[~succ], minlength=s),
        initial=initial,
        group_n=np.bincount(batch.rollout_group, minlength=batch.num_groups),
        group_pos=np.bincount(batch.rollout_group[batch.success], minlength=batch.num_groups),
    )


def discover(ev: StateEvidence, state_group: np.ndarray, m_min: int) -> tuple[np.ndarray, np.ndarray]:
    """Milestone Discovery (docs/algorithms.md, "MileGPO v2": discovery), with exact integer comparisons of rates.

    Milestone: not initial, n+(v) >= min(m_min, N+) with N+ >= 1, and n+/(n+ + n-) > p̄.
    Trap: not initial, visited by >= 2 failed rollouts or revisited within one, and n+/(n+ + n-) < p̄.
    """
    n, pos = ev.group_n[state_group], ev.group_pos[state_group]
    visitors = ev.n_pos + ev.n_neg
    above = ev.n_pos * n > pos * visitors  # p(v) > p̄
    below = ev.n_pos * n < pos * visitors
    milestone = ~ev.initial & (pos >= 1) & (ev.n_pos >= np.minimum(m_min, pos)) & above
    recurs = (ev.n_neg >= 2) | (ev.fail_visits > ev.n_neg)
    trap = ~ev.initial & recurs & below
    return milestone, trap


@dataclass(frozen=True, eq=False)
class BranchEvidence:
    pair: np.ndarray  # per step: id of its (u, a) pair
    num_pairs: int
    pair_state: np.ndarray  # per pair: u
    q: np.ndarray  # per step: Q(u, a_t), mean outcome of the steps that took a_t at u
    v: np.ndarray  # per step: V(u), mean outcome over all visits of u
    alternative: np.ndarray  # per step: the group shows >= 2 distinct actions at u
    sign: np.ndarray  # per step: sign(Q - V) where alternative, else 0 (int8)


def branch_evidence(batch: RolloutBatch, values: np.ndarray | None = None, tol: float = 1e-12) -> BranchEvidence:
    """Same-state branch evidence Q(u, a), V(u) (docs/algorithms.md); ``values`` per step default to the rollout outcome.

    Q(u, a) = mean of ``values`` over the steps that took a at u; V(u) = mean over all steps at u.
    """
    st, pair, pair_state = batch.step_state, batch.step_pair, batch.pair_state
    x = batch.outcome[batch.step_rollout] if values is None else values
    num_pairs = pair_state.size
    q = np.bincount(pair, weights=x, minlength=num_pairs) / np.maximum(np.bincount(pair, minlength=num_pairs), 1)
    v = np.bincount(st, weights=x, minlength=batch.num_states) / np.maximum(np.bincount(st, minlength=batch.num_states), 1)
    alt = np.bincount(pair_state, minlength=batch.num_states)[st] >= 2
    diff = q[pair] - v[st]
    sign = np.where(alt, np.sign(np.where(np.abs(diff) <= tol, 0.0, diff)), 0).astype(np.int8)
    return BranchEvidence(pair=pair, num_pairs=num_pairs, pair_state=pair_state, q=q[pair], v=v[st],
                          alternative=alt, sign=sign)


def progress_verdict(batch: RolloutBatch, graph: RolloutGraph, ev: StateEvidence) -> np.ndarray:
    """+1 where d(s_{t+1}) < d(s_t), -1 otherwise, 0 in a group without a success (int8)."""
    d = graph.distance
    step = np.where(d[graph.next_node] < d[batch.step_state], 1, -1)
    return np.where(ev.group_pos[batch.step_group] > 0, step, 0).astype(np.int8)


def entry_steps(batch: RolloutBatch, graph: RolloutGraph) -> np.ndarray:
    """True at step t when s_{t+1} is a state first visited at t + 1 (its incoming transition)."""
    entry = np.zeros(batch.num_steps, dtype=bool)
    entry[:-1] = graph.first_visit[1:]
    entry &= ~batch.step_last
    return entry
