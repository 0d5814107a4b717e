"""One training iteration (docs/architecture.md, "One training iteration"): sample G tasks, roll out
G x N episodes, assign credit, update the policy; returns the iteration's metrics and store records.

Every random draw derives from (seed, iteration): the global RNGs are reseeded at the start, and the
G tasks are drawn without replacement from the seed's PPO pool (trainer/task_pools.py) by
``derive_seed(seed, "tasks", iteration)``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from envs.faults import fault_point
from milegpo_cli.config import Config
from milegpo_cli.credit import RolloutBatch, compute_advantages
from milegpo_cli.credit.memory import Memory
from milegpo_cli.credit.result import Candidate, CreditResult
from milegpo_cli.store.records import EpisodeRecord
from milegpo_cli.trainer.distributed import gather_iteration, group_offset, rank_parts, shard, world_size
from milegpo_cli.trainer.credit_memory import memory_metrics
from milegpo_cli.trainer.episode_records import episode_record, to_rollout
from milegpo_cli.trainer.evaluation import episode_metrics
from milegpo_cli.trainer.rollout import RolloutStats, reward_penalty, run_episodes
from milegpo_cli.trainer.seeding import derive_seed, seed_everything
from milegpo_cli.trainer.task_pools import ppo_pool
from milegpo_cli.trainer.threads import ThreadPlan


@dataclass
class IterationResult:
    metrics: dict[str, float]
    episodes: list[EpisodeRecord]
    candidates: list[Candidate]
    credit: CreditResult | None = None


def numeric_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of ``metrics`` as floats (what MLflow and the store's metrics take)."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float, np.number))}


def train_pool(config: Config, suite) -> list:
    """The run seed's PPO task pool of ``rollout.train_tasks`` tasks of ``run.task_types`` (trainer/task_pools.py)."""
    return ppo_pool(suite, config.rollout.train_tasks, config.run.seed, config.run.task_types)


def sample_tasks(pool: Sequence, groups: int, seed: int, iteration: int) -> list:
    """G distinct tasks of the pool for ``iteration``: a pure function of (seed, iteration)."""
    rng = np.random.default_rng(derive_seed(seed, "tasks", iteration))
    return [pool[i] for i in rng.choice(len(pool), size=groups, replace=False)]


def train_iteration(config: Config, policy, updater, venv, pool: Sequence, suite, iteration: int,
                    *, threads: ThreadPlan, memory: Memory | None = None) -> IterationResult:
    """Sample tasks for ``iteration``, roll out G x N episodes (threads and lanes of ``threads``), assign
    credit, update the policy."""
    acc = updater.accelerator  # data parallel (trainer/distributed.py): this rank's block of the K x G tasks
    seed_everything(derive_seed(config.run.seed, "iteration", iteration, *rank_parts(acc)))
    tasks = shard(sample_tasks(pool, config.rollout.groups * world_size(acc), config.run.seed, iteration), acc)
    stats = RolloutStats()
    t0 = time.perf_counter()
    with threads.rolling_out():
        episodes = run_episodes(policy, venv, tasks, config.rollout.group_size, max_steps=suite.max_steps,
                                success_reward=config.rollout.success_reward,
                                invalid_penalty=reward_penalty(config), stats=stats, lanes=threads.rollout.lanes)
    for e in episodes:  # group numbers unique over ranks
        e.group += group_offset(acc, config.rollout.groups)
    t_rollout = time.perf_counter() - t0

    t0 = time.perf_counter()
    valid = [e for e in episodes if not e.errored]
    batch = RolloutBatch.from_rollouts([to_rollout(e, iteration) for e in valid], config.credit.success_threshold)
    result = compute_advantages(batch, config.run.algo, config.credit, memory=memory)  # its drop list: config.credit.drop
    t_credit = time.perf_counter() - t0

    t0 = time.perf_counter()
    samples = [s for e in valid for s in e.samples]
    advantages = torch.as_tensor(result.advantage, dtype=torch.float32)
    if fault_point("ppo.advantages"):  # test-only: non-finite advantages (envs/faults.py)
        advantages = torch.full_like(advantages, float("nan"))
    weights = np.concatenate([np.full(e.length, 1.0 / e.length) for e in valid]) \
        if config.ppo.loss_agg == "episode-mean" and samples else None
    update = updater.update(samples, advantages, weights) if samples else {}
    t_update = time.perf_counter() - t0

    parts = {k: getattr(result, k) for k in ("advantage", "episode_advantage", "step_advantage", "credit",
                                              "milestone", "trap", "progress", "branch", "unverified")}
    records, offset = [], 0
    for e in episodes:
        if e.errored:
            records.append(episode_record(e))
        else:
            records.append(episode_record(e, parts, offset))
            offset += e.length
    every = gather_iteration(episodes, records, list(result.candidates), stats.steps,
                             policy.model, acc)  # all ranks' output (one process: this one's)
    total = t_rollout + t_credit + t_update
    metrics = {
        **episode_metrics(every.episodes),
        **numeric_metrics(update),
        **({"skipped_reason": update["skipped_reason"]} if "skipped_reason" in update else {}),
        "milestones": float(sum(c.kind == "milestone" for c in every.candidates)),
        "traps": float(sum(c.kind == "trap" for c in every.candidates)),
        "credit_nonzero_share": float(np.mean(result.credit != 0)) if batch.num_steps else 0.0,
        "steps": float(every.steps),
        "world_size": float(every.world_size),
        **({"weights_equal_across_ranks": float(every.weights_equal)} if every.world_size > 1 else {}),
        "time_rollout_s": t_rollout,
        "time_credit_s": t_credit,
        "time_update_s": t_update,
        "time_policy_s": stats.policy_s,
        "time_env_s": stats.env_s,
        "credit_time_share": t_credit / total if total > 0 else 0.0,
        "rollout_steps_per_s": stats.steps / t_rollout if t_rollout > 0 else 0.0,
        "cache_hit_rate": stats.cache_hits / stats.steps if stats.steps else 0.0,
        **memory_metrics(batch, result),
    }
    return IterationResult(metrics, every.records, every.candidates, result)
