"""verl turn rows <-> the project's rollout batch (no verl import: arrays in, arrays out).

A multi-turn episode reaches verl's advantage step as one row per turn (an agent loop's list of
``AgentLoopOutput``). Each row carries the episode reward on its response tokens (verl copies the
final turn's ``reward_score`` to every turn) and, in ``extra_fields``, the fields named by
:data:`FIELDS`. The rows are regrouped into :class:`~milegpo_cli.credit.RolloutBatch` exactly as
``milegpo credit`` reads the same episodes from JSON Lines (docs/rollouts.md): group = the row's
``uid``, rollout = its episode id, steps in turn order, outcome R_i = the row's reward sum.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ...credit import CreditConfig, Rollout, RolloutBatch, compute_advantages

# extra_fields key -> meaning (docs/scale.md, "MileGPO in verl")
FIELDS = {
    "milegpo_episode": "episode id, unique within the row's uid group",
    "milegpo_t": "turn index t = 0, 1, ... within the episode",
    "milegpo_state": "state key kappa(s_t) in which the turn's action was taken",
    "milegpo_action": "the environment action the turn's reply was parsed to",
    "milegpo_invalid": "true when the reply was unparsable or inadmissible",
    "milegpo_step_reward": "the environment's reward for the turn (its invalid-action penalty included)",
    "milegpo_final_state": "kappa(s_T), the state the episode's last action led to ('' = unknown)",
}
# optional: the episode reward R_i in float64 (verl's rm_scores are float32); must agree with the row's reward sum
REWARD = "milegpo_reward"


def float32_close(a: float, b: float) -> bool:
    """Equal up to the rounding of float32 reward tensors."""
    return abs(a - b) <= 1e-6 * (1.0 + abs(a))


class TurnFieldsError(ValueError):
    """Turn rows that cannot be regrouped into episodes (message: ``<field>: <reason>``, one line)."""


def _column(rows: Sequence[Mapping], key: str) -> list:
    missing = next((i for i, row in enumerate(rows) if key not in row), None)
    if missing is not None:
        raise TurnFieldsError(f"extra_fields.{key}: missing on row {missing} (the milegpo agent loops set it; "
                              "docs/scale.md, 'MileGPO in verl')")
    return [row[key] for row in rows]


def rows_to_batch(outcomes: np.ndarray, index: Sequence, fields: Sequence[Mapping],
                  success_threshold: float = 1.0) -> tuple[RolloutBatch, np.ndarray]:
    """Regroup turn rows into rollouts; returns the batch and, per flattened batch step, its row.

    ``outcomes[k]``: row k's episode reward (its token rewards' sum); ``index[k]``: its group (verl's
    ``uid``); ``fields[k]``: its :data:`FIELDS` (and :data:`REWARD`, which replaces ``outcomes[k]``).
    Rows may come in any order; an episode's turns must be t = 0 .. L-1 and carry one reward and one
    final state."""
    n = len(outcomes)
    if len(index) != n or len(fields) != n:
        raise TurnFieldsError(f"rows: {n} reward rows, {len(index)} uids, {len(fields)} extra_fields")
    cols = {key: _column(fields, key) for key in FIELDS}
    outcomes = np.array(outcomes, dtype=np.float64)
    for row, f in enumerate(fields):
        if REWARD in f:
            if not float32_close(float(f[REWARD]), outcomes[row]):
                raise TurnFieldsError(f"extra_fields.{REWARD}: row {row} says {f[REWARD]!r} but its token rewards "
                                      f"sum to {outcomes[row]!r} (is algorithm.use_kl_in_reward on?)")
            outcomes[row] = float(f[REWARD])
    rows_of: dict = {}
    for row in range(n):
        rows_of.setdefault((str(index[row]), str(cols["milegpo_episode"][row])), []).append(row)
    rollouts, order = [], []
    for (group, episode), rows in rows_of.items():
        rows.sort(key=lambda r: int(cols["milegpo_t"][r]))
        where = f"episode {episode!r} of uid {group!r}"
        ts = [int(cols["milegpo_t"][r]) for r in rows]
        if ts != list(range(len(rows))):
            raise TurnFieldsError(f"extra_fields.milegpo_t: {where} has turns {ts}, expected 0..{len(rows) - 1}")
        scores = outcomes[rows]
        if np.ptp(scores) > 0:
            raise TurnFieldsError(f"token_level_rewards: the turns of {where} carry different episode rewards "
                                  f"{sorted(set(scores.tolist()))} (is algorithm.use_kl_in_reward on?)")
        finals = {str(cols["milegpo_final_state"][r]) for r in rows}
        if len(finals) != 1:
            raise TurnFieldsError(f"extra_fields.milegpo_final_state: {where} has {len(finals)} different values")
        final = finals.pop()
        rollouts.append(Rollout(group=group, rollout_id=episode, outcome=float(scores[0]),
                                states=[str(cols["milegpo_state"][r]) for r in rows],
                                actions=[str(cols["milegpo_action"][r]) for r in rows],
                                rewards=[float(cols["milegpo_step_reward"][r]) for r in rows],
                                invalid=[bool(cols["milegpo_invalid"][r]) for r in rows],
                                final_state=final or None))
        order.extend(rows)
    return RolloutBatch.from_rollouts(rollouts, success_threshold), np.asarray(order, dtype=np.int64)


def row_advantages(outcomes: np.ndarray, index: Sequence, fields: Sequence[Mapping], algo: str,
                   config: CreditConfig) -> np.ndarray:
    """A_k per row: ``compute_advantages(batch, algo, config)`` of the regrouped episodes, step t of
    episode i put back on the row that carried it."""
    batch, order = rows_to_batch(np.asarray(outcomes, dtype=np.float64), index, fields, config.success_threshold)
    per_row = np.empty(len(order))
    per_row[order] = compute_advantages(batch, algo, config).advantage
    return per_row


def rollout_rows(rollouts: Sequence[Rollout]) -> tuple[np.ndarray, list[str], list[dict]]:
    """The inverse of :func:`rows_to_batch` (tests and benches): per turn row its
    episode reward, uid and :data:`FIELDS`, rollout by rollout in turn order."""
    outcomes, index, fields = [], [], []
    for r in rollouts:
        invalid = r.invalid if r.invalid is not None else [False] * len(r.states)
        for t, (state, action, reward, bad) in enumerate(zip(r.states, r.actions, r.rewards, invalid, strict=True)):
            outcomes.append(float(r.outcome))
            index.append(r.group)
            fields.append({"milegpo_episode": str(r.rollout_id), "milegpo_t": t, "milegpo_state": state,
                           "milegpo_action": action, "milegpo_invalid": bool(bad), "milegpo_step_reward": float(reward),
                           "milegpo_final_state": r.final_state or "", REWARD: float(r.outcome)})
    return np.asarray(outcomes, dtype=np.float64), index, fields
