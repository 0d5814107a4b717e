"""The trainer's side of ``credit.memory`` (credit/memory.py): the memory kept across iterations in the
run store, so that a resumed run continues with the memory it had at its checkpoint, and the per-iteration
numbers ``milegpo diagnose`` shows (how many groups without a success got memory credit, and how much).
"""
from __future__ import annotations

import numpy as np

from milegpo_cli.config import Config
from milegpo_cli.credit import RolloutBatch
from milegpo_cli.credit.memory import Memory, TaskMemory
from milegpo_cli.credit.result import CreditResult
from milegpo_cli.errors import ConfigError
from milegpo_cli.trainer.checkpoint import list_checkpoints
from milegpo_cli.trainer.resume import checkpoint_root


class RunMemory:
    """The memory of one run: ``tasks`` (None when ``credit.memory`` is off) as of the last iteration kept.

    Stored: the tasks each iteration changed; rows that no kept checkpoint can resume to (a task's rows before
    its last row at or before the oldest checkpoint in the run folder) are dropped, so the table holds at most
    one row per task of the pool plus the tasks played since that checkpoint.
    """

    def __init__(self, config: Config, store, run_id: int, start: int, world_size: int = 1):
        on = config.run.algo == "milegpo" and config.credit.memory and "memory" not in config.credit.drop
        if on and world_size > 1:
            raise ConfigError("credit.memory: not supported with data-parallel training yet (world size "
                             f"{world_size}); train on one process or set credit.memory=false")
        self.tasks: Memory | None = None
        self.checkpoints = checkpoint_root(config, run_id)
        if on:
            self.tasks = {t: TaskMemory.from_dict(m) for t, m in store.task_memory(run_id, start).items()}

    def keep(self, store, run_id: int, iteration: int, result: CreditResult) -> None:
        """Take the memory after ``iteration`` and store the tasks it changed (main process)."""
        if self.tasks is None or result.memory is None:
            return
        changed = {t: m.to_dict() for t, m in result.memory.items() if m.iteration == iteration}
        store.record_task_memory(run_id, iteration, changed)
        kept = list_checkpoints(self.checkpoints)
        if kept:
            store.prune_task_memory(run_id, kept[0][0])
        self.tasks = result.memory


def memory_metrics(batch: RolloutBatch, result: CreditResult) -> dict[str, float]:
    """Per iteration: groups without a success, those of them that got memory credit (a progress verdict or a
    milestone entry, which such a group only gets from recalled evidence), the mean |credit| of their steps,
    and the size of the memory (tasks, states + transitions)."""
    if result.memory is None:
        return {}
    won = np.bincount(batch.rollout_group, weights=batch.success, minlength=batch.num_groups) > 0
    credited = np.zeros(batch.num_groups, bool)
    credited[batch.step_group[(result.progress != 0) | result.milestone]] = True
    credited &= ~won
    steps = credited[batch.step_group]
    return {"memory_all_fail_groups": float((~won).sum()), "memory_credited_groups": float(credited.sum()),
            "memory_credit_abs_mean": float(np.abs(result.credit[steps]).mean()) if steps.any() else 0.0,
            "memory_tasks": float(len(result.memory)),
            "memory_entries": float(sum(m.size() for m in result.memory.values()))}
