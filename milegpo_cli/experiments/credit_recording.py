"""Credit diagnostics, the recording half (docs/algorithms.md, "Choosing the defaults"; issues 9, 10 and 15).

A fixed behaviour policy plays groups of N rollouts of one task: at every step it takes the oracle's
action with probability 1 - p, else a uniformly random admissible action (``expert_or_random``).
Every step is stored with its oracle label (good = the action is in ``Observation.oracle_actions`` of
that state; None where the oracle had no answer) and the true subgoals it reached. One JSON line per
rollout, in the interchange format of docs/rollouts.md plus extra keys (``milegpo credit`` reads it
once decompressed: ``zcat``), appended group by group to a multi-member gzip file: an interrupted
recording resumes where it stopped. The evaluation half: experiments/credit_bench.py.
"""
from __future__ import annotations

import gzip
import json
import random
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

from envs.base import EnvSuite, Observation, Task
from milegpo_cli.errors import MilegpoError


class CreditBenchError(MilegpoError, ValueError):
    """Bad input to the credit benchmark (bad p, empty recording, unknown subset...)."""


def expert_or_random(obs: Observation, p: float, rng: random.Random) -> str:
    """The oracle's first action with probability 1 - p, else a uniform admissible action
    (also when the oracle has no answer for this state)."""
    if obs.oracle_actions and rng.random() >= p:
        return obs.oracle_actions[0]
    if not obs.admissible:
        raise CreditBenchError("expert_or_random: a state with no admissible action")
    return rng.choice(obs.admissible)


def group_name(task: Task, p: float) -> str:
    return f"{task.task_id}|p={p:g}"


def record_group(env, task: Task, p: float, group_size: int, seed: int,
                 success_reward: float = 10.0) -> list[dict]:
    """Play ``group_size`` rollouts of ``task`` with ``expert_or_random(p)`` in one vector env.

    Rewards follow the trainer (verl-agent): ``success_reward`` on the winning step, else 0.
    Returns one record per rollout (docs/rollouts.md fields, ``final_state`` included, plus ``oracle_good`` / ``subgoals``
    per step and ``task_id``, ``task_type``, ``split``, ``p``, ``error`` per rollout).
    """
    if not 0.0 <= p <= 1.0:
        raise CreditBenchError(f"p: must be in [0, 1], got {p}")
    name = group_name(task, p)
    rngs = [random.Random(f"{name}|{seed}|{i}") for i in range(group_size)]
    obs = env.reset([task] * group_size)
    steps: list[list[dict]] = [[] for _ in range(group_size)]
    won, score, error = [False] * group_size, [0.0] * group_size, [None] * group_size
    final: list[str | None] = [None] * group_size
    active = [True] * group_size
    while any(active):
        actions = [expert_or_random(o, p, rng) if a else None for o, a, rng in zip(obs, active, rngs)]
        results = env.step(actions)
        for i, res in enumerate(results):
            if res is None:
                continue
            o = obs[i]
            good = None if not o.oracle_actions else actions[i] in o.oracle_actions
            steps[i].append({"state": o.state_key, "action": actions[i],
                             "reward": success_reward if (res.done and res.won) else 0.0,
                             "oracle_good": good, "subgoals": list(res.subgoals)})
            obs[i], active[i] = res.observation, not res.done
            won[i], score[i], final[i] = res.won, res.score, res.observation.state_key
            error[i] = error[i] or (res.error.splitlines()[-1] if res.error else None)
    return [{"group": name, "rollout": i, "outcome": float(score[i]), "success": bool(won[i]),
             "task_id": task.task_id, "task_type": task.task_type, "split": task.split, "p": p,
             "error": error[i], "final_state": final[i], "steps": steps[i]} for i in range(group_size)]


def read_records(path: str | Path) -> list[dict]:
    """All rollout records of a recording (gzip or plain JSONL)."""
    path = Path(path)
    if not path.exists():
        return []
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def append_records(path: str | Path, records: Iterable[dict]) -> None:
    """Append one gzip member (or plain lines) per call, so a killed run loses at most one group."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "at") as f:
        f.writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in records)


def record(suite: EnvSuite, tasks: Sequence[Task], p_values: Sequence[float], path: str | Path, *,
           group_size: int = 8, seed: int = 0, success_reward: float = 10.0,
           budget_s: float | None = None, log: Callable[[str], None] = print) -> dict:
    """Record one group per (task, p) into ``path``, skipping groups already there.

    Tasks are played in order, every p for a task before the next task, until ``budget_s``
    seconds have passed (None: no limit). Returns counts and timing.
    """
    if group_size < 2:
        raise CreditBenchError(f"group_size: must be >= 2, got {group_size}")
    done = {r["group"] for r in read_records(path)}
    env = suite.make_vector_env(group_size, oracle=True)
    start, new_groups, new_steps = time.perf_counter(), 0, 0
    try:
        for k, task in enumerate(tasks):
            for p in p_values:
                if group_name(task, p) in done:
                    continue
                if budget_s is not None and time.perf_counter() - start > budget_s:
                    log(f"budget of {budget_s:.0f} s reached after {new_groups} new groups")
                    return _summary(path, new_groups, new_steps, start)
                t0 = time.perf_counter()
                recs = record_group(env, task, p, group_size, seed, success_reward)
                append_records(path, recs)
                n = sum(len(r["steps"]) for r in recs)
                new_groups, new_steps = new_groups + 1, new_steps + n
                log(f"[{k + 1}/{len(tasks)}] {task.task_id} p={p:g}: {n} steps, "
                    f"{sum(r['success'] for r in recs)}/{group_size} won, {time.perf_counter() - t0:.1f} s")
    finally:
        env.close()
    return _summary(path, new_groups, new_steps, start)


def _summary(path, groups: int, steps: int, start: float) -> dict:
    wall = time.perf_counter() - start
    return {"path": str(path), "new_groups": groups, "new_steps": steps, "wall_s": round(wall, 1),
            "steps_per_s": round(steps / wall, 1) if wall > 0 else float("nan")}
