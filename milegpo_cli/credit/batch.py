"""The rollout batch: G groups of N rollouts, flattened step by step into numpy arrays.

State keys and actions are interned to integers *per group* (a key met in two groups gives two
ids), so that every graph computation is a vectorised operation on integer arrays.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from milegpo_cli.errors import MilegpoError

MAX_MAGNITUDE = 1e100  # |outcome|, |reward| above this would overflow the sums of squares of the statistics


class CreditError(MilegpoError, ValueError):
    """A rollout batch the estimators cannot use (message: ``<field>: <reason>``, one line)."""


@dataclass(frozen=True)
class Rollout:
    """One episode: ``states[t]`` is the state key kappa(s_t) in which ``actions[t]`` was taken."""

    group: str
    rollout_id: str | int
    states: Sequence[str]
    actions: Sequence[str]
    rewards: Sequence[float]
    outcome: float
    success: bool | None = None  # None -> outcome >= success_threshold
    invalid: Sequence[bool] | None = None  # per step: the reply was unparsable / inadmissible (verl-agent penalty)
    subgoals: Sequence[Sequence[str]] | None = None  # per step: true subgoals newly reached (oracle-milestones)
    final_state: str | None = None  # kappa(s_T), the state the last step led to; None = unknown
    task: str | None = None  # groups with the same task share their states across iterations (credit/memory.py)
    iteration: int | None = None  # the order in which a task's groups were played; needs ``task``


@dataclass(frozen=True, eq=False)
class RolloutBatch:
    """Flattened batch. Steps are laid out rollout by rollout, in input order.

    Per rollout (length R): ``rollout_group``, ``outcome``, ``success``, ``length``, ``offset``.
    Per step (length n): ``step_rollout``, ``step_t``, ``step_group``, ``step_state`` (global
    interned state id), ``step_action`` (global interned action id), ``step_pair`` (interned
    (state, action) pair), ``step_last`` (last step of its rollout), ``step_success``, ``reward``.
    Per state id (length S): ``state_keys``, ``state_group``. Per pair id: ``pair_state``.
    ``rollout_final``: per rollout, the state id of its recorded final state, -1 where unknown; final
    states are interned after every step state, so the step-state ids do not depend on them.
    ``group_task`` / ``group_iteration``: per group, its task (None: no task and iteration given) and
    iteration (-1: none); both None when no rollout gives an iteration.
    """

    group_names: tuple[str, ...]
    rollout_ids: tuple[str | int, ...]
    rollout_group: np.ndarray
    outcome: np.ndarray
    success: np.ndarray
    length: np.ndarray
    offset: np.ndarray
    step_rollout: np.ndarray
    step_t: np.ndarray
    step_group: np.ndarray
    step_state: np.ndarray
    step_action: np.ndarray
    step_pair: np.ndarray
    step_last: np.ndarray
    step_success: np.ndarray
    reward: np.ndarray
    state_keys: tuple[str, ...]
    state_group: np.ndarray
    action_names: tuple[str, ...]
    pair_state: np.ndarray
    step_invalid: np.ndarray | None = None
    step_subgoals: np.ndarray | None = None
    has_subgoals: bool = False
    rollout_final: np.ndarray | None = None
    group_task: tuple[str | None, ...] | None = None
    group_iteration: np.ndarray | None = None

    @property
    def num_groups(self) -> int:
        return len(self.group_names)

    @property
    def num_rollouts(self) -> int:
        return len(self.rollout_ids)

    @property
    def num_steps(self) -> int:
        return int(self.step_state.shape[0])

    @property
    def num_states(self) -> int:
        return len(self.state_keys)

    @classmethod
    def from_rollouts(cls, rollouts: Sequence[Rollout], success_threshold: float = 1.0) -> "RolloutBatch":
        """Validate and flatten rollouts; raises CreditError naming the rollout and field."""
        if not math.isfinite(success_threshold):
            raise CreditError(f"success_threshold: must be finite, got {success_threshold!r}")
        group_index: dict[str, int] = {}
        seen: set[tuple[str, str | int]] = set()
        state_ids: dict[tuple[int, str], int] = {}
        action_ids: dict[tuple[int, str], int] = {}
        pair_ids: dict[tuple[int, int], int] = {}
        rollout_group, outcome, success, length = [], [], [], []
        states_flat: list[int] = []
        actions_flat: list[int] = []
        pairs_flat: list[int] = []
        rewards_flat: list[float] = []
        invalid_flat: list[bool] = []
        subgoals_flat: list[int] = []
        has_subgoals = bool(rollouts)
        group_order: dict[int, tuple[str | None, int | None]] = {}
        for r in rollouts:
            where = f"rollout {r.rollout_id!r} of group {r.group!r}"
            if (r.group, r.rollout_id) in seen:
                raise CreditError(f"rollout_id: duplicate {where}")
            seen.add((r.group, r.rollout_id))
            if not (len(r.states) == len(r.actions) == len(r.rewards)):
                raise CreditError(
                    f"steps: {where} has {len(r.states)} states, {len(r.actions)} actions, {len(r.rewards)} rewards"
                )
            out = float(r.outcome)
            if not math.isfinite(out):
                raise CreditError(f"outcome: {where} has non-finite outcome {r.outcome!r}")
            if abs(out) > MAX_MAGNITUDE:
                raise CreditError(f"outcome: {where} has |outcome| {out:.3g} > {MAX_MAGNITUDE:g} (rescale the scores)")
            big = next((x for x in r.rewards if math.isfinite(x) and abs(x) > MAX_MAGNITUDE), None)
            if big is not None:
                raise CreditError(f"rewards: {where} has |reward| {big:.3g} > {MAX_MAGNITUDE:g} (rescale the rewards)")
            for name, per_step in (("invalid", r.invalid), ("subgoals", r.subgoals)):
                if per_step is not None and len(per_step) != len(r.states):
                    raise CreditError(f"{name}: {where} has {len(per_step)} entries for {len(r.states)} steps")
            invalid_flat.extend(bool(x) for x in r.invalid) if r.invalid is not None else \
                invalid_flat.extend([False] * len(r.states))
            if r.subgoals is None:
                has_subgoals = False
                subgoals_flat.extend([0] * len(r.states))
            else:
                subgoals_flat.extend(len(sg) for sg in r.subgoals)
            g = group_index.setdefault(r.group, len(group_index))
            _check_order(r, where, group_order.setdefault(g, (r.task, r.iteration)))
            rollout_group.append(g)
            outcome.append(out)
            success.append(bool(r.success) if r.success is not None else out >= success_threshold)
            length.append(len(r.states))
            s_ids = [state_ids.setdefault((g, s), len(state_ids)) for s in r.states]
            a_ids = [action_ids.setdefault((g, a), len(action_ids)) for a in r.actions]
            states_flat.extend(s_ids)
            actions_flat.extend(a_ids)
            pairs_flat.extend(pair_ids.setdefault(sa, len(pair_ids)) for sa in zip(s_ids, a_ids))
            rewards_flat.extend(r.rewards)
        final = [-1 if r.final_state is None else
                 state_ids.setdefault((group_index[r.group], sys.intern(str(r.final_state))), len(state_ids))
                 for r in rollouts]
        reward = np.asarray(rewards_flat, dtype=np.float64)
        if reward.size and not np.isfinite(reward).all():
            bad = int(np.flatnonzero(~np.isfinite(reward))[0])
            raise CreditError(f"rewards: non-finite reward at flattened step {bad}")
        length_a = np.asarray(length, dtype=np.int64)
        offset = np.concatenate([[0], np.cumsum(length_a)[:-1]]).astype(np.int64) if length else np.zeros(0, np.int64)
        step_rollout = np.repeat(np.arange(len(length), dtype=np.int64), length_a)
        step_t = np.arange(step_rollout.size, dtype=np.int64) - offset[step_rollout]
        rollout_group_a = np.asarray(rollout_group, dtype=np.int64)
        keys = list(state_ids)
        success_a = np.asarray(success, dtype=bool)
        return cls(
            group_names=tuple(group_index),
            rollout_ids=tuple(r.rollout_id for r in rollouts),
            rollout_group=rollout_group_a,
            outcome=np.asarray(outcome, dtype=np.float64),
            success=success_a,
            length=length_a,
            offset=offset,
            step_rollout=step_rollout,
            step_t=step_t,
            step_group=rollout_group_a[step_rollout],
            step_state=np.asarray(states_flat, dtype=np.int64),
            step_action=np.asarray(actions_flat, dtype=np.int64),
            step_pair=np.asarray(pairs_flat, dtype=np.int64),
            step_last=step_t == length_a[step_rollout] - 1,
            step_success=success_a[step_rollout],
            reward=reward,
            state_keys=tuple(k for _, k in keys),
            state_group=np.asarray([g for g, _ in keys], dtype=np.int64),
            action_names=tuple(a for _, a in action_ids),
            pair_state=np.asarray([s for s, _ in pair_ids], dtype=np.int64),
            step_invalid=np.asarray(invalid_flat, dtype=bool),
            step_subgoals=np.asarray(subgoals_flat, dtype=np.int64),
            has_subgoals=has_subgoals,
            rollout_final=np.asarray(final, dtype=np.int64),
            **_group_order(group_order),
        )


def _check_order(r: Rollout, where: str, first: tuple[str | None, int | None]) -> None:
    """``iteration`` (an integer >= 0) needs a string ``task``; both are the same on every rollout of a group."""
    if r.iteration is not None and (not isinstance(r.task, str) or isinstance(r.iteration, bool)
                                    or not isinstance(r.iteration, (int, np.integer)) or r.iteration < 0):
        raise CreditError(f"iteration: {where} needs a string task and an integer iteration >= 0, "
                          f"got {r.task!r}, {r.iteration!r}")
    if (r.task, r.iteration) != first:
        raise CreditError(f"task: {where} has task {r.task!r} iteration {r.iteration!r}, its group has "
                          f"{first[0]!r} iteration {first[1]!r}")


def _group_order(order: dict[int, tuple[str | None, int | None]]) -> dict:
    """RolloutBatch's ``group_task`` / ``group_iteration``: a group's task counts only with its iteration
    (None when no group gives both)."""
    if all(it is None for _, it in order.values()):
        return {}
    return {"group_task": tuple(None if order[g][1] is None else order[g][0] for g in range(len(order))),
            "group_iteration": np.asarray([-1 if order[g][1] is None else int(order[g][1]) for g in range(len(order))],
                                          dtype=np.int64)}
