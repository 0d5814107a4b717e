"""Held-out evaluation and the expert-action probe (docs/learning.md, "An evaluation that can tell").

- **Evaluation**: one episode per task of a fixed, stored task list per split
  (``suite.tasks(split, eval.episodes, seed=EVAL_TASK_SEED)``, the same for every run and seed;
  ALFWorld's generator cycles the six task types, so a multiple of 6 tasks is stratified exactly),
  played in a forked RNG so that the training RNG is untouched. With ``run.task_types``, the list is
  the split's first ``eval.episodes`` tasks of those types (``suite.task_positions``), alternating
  between ALFWorld's types. Success is a binomial proportion:
  every printed rate comes with its Wilson 95 % interval (milegpo_cli/intervals.py).
- **Probe**: the mean log-probability and accuracy of the expert's action on a fixed set of held-out
  expert states (the expert's walkthroughs of the evaluation tasks of each split, without steps that
  issue a no-op command) — a low-variance signal, measured every iteration, that moves long before
  success does. Evaluation rows also keep each state's log-probability, for paired gains.

Every evaluation row carries a ``phase``: ``untrained`` (the model before any supervised step),
``warmstart`` (the policy PPO starts from: after the warm start or the cached base policy; the
untrained model itself when neither is used) or ``train`` (after PPO iteration k).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from milegpo_cli.errors import ConfigError
from milegpo_cli.intervals import wilson_interval
from milegpo_cli.trainer.rollout import Episode, RolloutStats, expert_walkthroughs, reward_penalty, run_episodes
from milegpo_cli.trainer.task_pools import tasks_at
from milegpo_cli.trainer.threads import ThreadPlan

EVAL_TASK_SEED = 0  # the fixed evaluation task lists do not depend on the run seed
# evaluation episodes played at a time: fixed, so that the evaluation's random draws and the probe's
# states (the first steps of the first walkthroughs, in step order) do not depend on the recipe's G x N
EVAL_ENVS = 16
PROBE_STATE_LOGPS = "probe_expert_logp_states"  # stored with evaluation rows only
PHASES = ("untrained", "warmstart", "train")


def format_success(metrics: dict[str, float]) -> str:
    """"0.312 [0.23, 0.41] n=102": success rate, Wilson 95 % interval and the number of episodes."""
    n = int(metrics.get("episodes", 0))
    lo, hi = wilson_interval(metrics["success_rate"] * n, n) or (0.0, 1.0)
    return f"{metrics['success_rate']:.3f} [{lo:.2f}, {hi:.2f}] n={n}"


def episode_metrics(episodes) -> dict[str, float]:
    """Success rate (with its Wilson interval), mean outcome (WebShop score), the share of episodes the
    engine ended (WebShop: a purchase) and the mean outcome of those, mean length, invalid-action
    rate, errored count."""
    steps = sum(e.length for e in episodes)
    ok = [e for e in episodes if not e.errored]
    ended = [e for e in ok if e.done]
    wins = sum(e.won for e in ok)
    lo, hi = wilson_interval(wins, len(ok)) or (0.0, 1.0)
    return {
        "success_rate": wins / len(ok) if ok else 0.0,
        "success_ci_low": lo,
        "success_ci_high": hi,
        "mean_outcome": sum(e.score for e in ok) / len(ok) if ok else 0.0,
        "ended_rate": len(ended) / len(ok) if ok else 0.0,
        "outcome_given_ended": sum(e.score for e in ended) / len(ended) if ended else 0.0,
        "mean_length": sum(e.length for e in episodes) / len(episodes) if episodes else 0.0,
        "invalid_rate": sum(sum(e.invalid) for e in episodes) / steps if steps else 0.0,
        "errored": float(len(episodes) - len(ok)),
        "episodes": float(len(episodes)),
    }


def eval_tasks(suite, split: str, episodes: int, task_types: tuple[str, ...] = ()) -> list:
    """The fixed, stored task list of a split (independent of the run seed), of ``task_types`` only
    when given (run.task_types)."""
    if not task_types:
        return suite.tasks(split, episodes, seed=EVAL_TASK_SEED)
    positions = suite.task_positions(split, task_types)
    if len(positions) < episodes:
        raise ConfigError(f"eval.episodes: {episodes} tasks asked, split {split} holds {len(positions)} "
                          f"of run.task_types (its pool: {suite.split_size(split)} tasks)")
    return tasks_at(suite, split, positions[:episodes], EVAL_TASK_SEED)


def run_evaluation(config, policy, venv, suite, split: str, episodes: int, seed: int,
                   threads: ThreadPlan) -> tuple[dict[str, float], list[Episode]]:
    """One episode per fixed task of ``split`` (of ``run.task_types``), in a forked RNG seeded from ``seed``,
    with the rollout's threads and lanes of ``threads``."""
    tasks = eval_tasks(suite, split, episodes, config.run.task_types)
    played: list[Episode] = []
    stats = RolloutStats()
    with torch.random.fork_rng(devices=[]), threads.rolling_out():
        torch.manual_seed(seed)
        for start in range(0, len(tasks), venv.num_envs):
            chunk = run_episodes(policy, venv, tasks[start:start + venv.num_envs], 1, max_steps=suite.max_steps,
                                 success_reward=config.rollout.success_reward,
                                 invalid_penalty=reward_penalty(config), greedy=config.eval.greedy,
                                 temperature=config.eval.temperature, stats=stats, lanes=threads.rollout.lanes)
            for ep in chunk:
                ep.group += start
            played.extend(chunk)
    return episode_metrics(played), played


def evaluation_metrics(split: str, phase: str | None, metrics: dict) -> dict[str, float]:
    """An evaluation's metrics as MLflow holds them: ``eval_<split>/...`` after training iterations (phase
    ``train``), ``eval_<phase>_<split>/...`` for the policy PPO starts from."""
    prefix = f"eval_{split}/" if phase in ("train", None) else f"eval_{phase}_{split}/"
    return {prefix + k: v for k, v in Probe.scalars(metrics).items()}


@dataclass
class Probe:
    """Held-out expert states per split (collected once per run) and the policy's score on them."""

    steps: dict[str, list] = field(default_factory=dict)  # split -> trainer.warmstart.ExpertStep

    @classmethod
    def collect(cls, suite, splits, eval_episodes: int, max_states: int, num_envs: int,
                task_types: tuple[str, ...] = ()) -> "Probe":
        """The expert's walkthroughs of the first evaluation tasks of each split, ``num_envs`` tasks at
        a time until ``max_states`` steps are collected (then cut to exactly that many). Steps whose
        command is one of the suite's no-op commands are left out: a policy that learns to skip
        ALFWorld's opening "look" has not moved away from the expert (docs/learning.md)."""
        probe = cls()
        if max_states <= 0:
            return probe
        venv = suite.make_vector_env(num_envs, oracle=True)
        try:
            for split in splits:
                tasks, steps = eval_tasks(suite, split, eval_episodes, task_types), []
                for start in range(0, len(tasks), num_envs):
                    steps += [s for s in expert_walkthroughs(venv, tasks[start:start + num_envs], suite.max_steps)[0]
                              if s.action not in suite.no_op_commands]
                    if len(steps) >= max_states:
                        break
                probe.steps[split] = steps[:max_states]
        finally:
            venv.close()
        return probe

    def measure(self, policy) -> dict[str, dict]:
        """split -> {"probe_expert_logp", "probe_expert_acc" (score mode), PROBE_STATE_LOGPS: the
        log-probability of each state in state order, so that two evaluations of a run (or of runs
        of one recipe) are compared state by state}."""
        from milegpo_cli.trainer.warmstart import expert_scores

        out = {}
        for split, steps in self.steps.items():
            if steps:
                logps, hits = self.state_scores(policy, split)
                out[split] = {**{f"probe_{k}": v for k, v in expert_scores(logps, hits).items()},
                              PROBE_STATE_LOGPS: [round(v, 5) for v in logps]}
        return out

    def state_scores(self, policy, split: str) -> tuple[list[float], list[bool] | None]:
        """Per state of ``split``, in state order: log pi(expert action | state) and (score mode)
        whether the expert's command is the most probable one (trainer.warmstart.expert_logprobs)."""
        from milegpo_cli.trainer.warmstart import expert_logprobs

        return expert_logprobs(policy, [policy.make_sample(s.observation, s.history, s.steps_taken, s.action)
                                        for s in self.steps[split]])

    @staticmethod
    def scalars(values: dict) -> dict[str, float]:
        """Metrics of one split (the probe's or a whole evaluation's) without the per-state probe list:
        what goes to iteration metrics and MLflow."""
        return {k: v for k, v in values.items() if k != PROBE_STATE_LOGPS}
