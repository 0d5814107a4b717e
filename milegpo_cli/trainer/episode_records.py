"""Played episodes as the credit package's :class:`Rollout` and as the store's records."""
from __future__ import annotations

import numpy as np

from milegpo_cli.credit import Rollout
from milegpo_cli.store.records import EpisodeRecord, StepRecord
from milegpo_cli.trainer.rollout import INVALID_ACTION, Episode


def group_key(group: int) -> str:
    return f"g{group}"


def to_rollout(ep: Episode, iteration: int | None = None) -> Rollout:
    """The credit package's view of an episode, with its invalid flags and true subgoals; its rewards
    carry the invalid penalty only where the estimator does not apply it (``rollout.reward_penalty``).
    ``iteration``: with the task, the order of its groups (credit/memory.py)."""
    return Rollout(group=group_key(ep.group), rollout_id=ep.index, states=list(ep.states),
                   actions=[a if a is not None else INVALID_ACTION for a in ep.actions], rewards=list(ep.rewards),
                   outcome=ep.score, success=ep.won, invalid=list(ep.invalid),
                   subgoals=[tuple(g) for g in ep.subgoals], final_state=ep.final_state or None,
                   task=ep.task.task_id, iteration=iteration)


def episode_record(ep: Episode, parts: dict[str, np.ndarray] | None = None, offset: int = 0) -> EpisodeRecord:
    """Store record of an episode; ``parts`` are CreditResult arrays, this episode's steps from ``offset``."""
    steps = []
    for t in range(ep.length):
        row = {} if parts is None else {
            "advantage": float(parts["advantage"][offset + t]),
            "episode_advantage": float(parts["episode_advantage"][offset + t]),
            "step_advantage": float(parts["step_advantage"][offset + t]),
            "credit": float(parts["credit"][offset + t]),
            "milestone": bool(parts["milestone"][offset + t]),
            "trap": bool(parts["trap"][offset + t]),
            "progress": int(parts["progress"][offset + t]),
            "branch": int(parts["branch"][offset + t]),
            "unverified": bool(parts["unverified"][offset + t]),
        }
        steps.append(StepRecord(t=t, state_key=ep.states[t], action=ep.actions[t] or INVALID_ACTION,
                                reward=ep.rewards[t], oracle_good=ep.oracle[t], subgoals=ep.subgoals[t], **row))
    return EpisodeRecord(task_id=ep.task.task_id, split=ep.task.split, task_type=ep.task.task_type,
                         group=group_key(ep.group), index=ep.index, outcome=ep.score, success=ep.won,
                         length=ep.length, invalid_count=sum(ep.invalid), error=ep.error, steps=steps,
                         final_state=ep.final_state or None)
