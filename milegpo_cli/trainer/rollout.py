"""Group rollouts (docs/architecture.md, "One training iteration"): G tasks x N rollouts stepped as one batch.

All G*N episodes live in one VectorEnv; at every step one batched ``policy.act`` call serves every
episode still running. Reward convention (verl-agent): ``success_reward`` x success on the
terminal step (WebShop: success means score 1; the raw score is kept in ``score``), minus
``invalid_penalty`` (:func:`reward_penalty`) on a step whose reply was unparsable or inadmissible (the engine receives the
never-admissible ``INVALID_ACTION`` and answers it as a no-op, counting the step). An engine error (``StepResult.error``) ends the episode and marks
it errored: it is stored but left out of credit assignment and the update.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from envs.base import StepResult, Task, VectorEnv

INVALID_ACTION = "<invalid>"  # sent to the engine for an unparsable reply (never admissible: a no-op step)


def reward_penalty(config) -> float:
    """The penalty folded into the reward of an invalid step (docs/rollouts.md, ``steps[t].reward``):
    ``policy.invalid_penalty``, or 0 when the estimator applies its own from the ``invalid`` flags
    (``credit.invalid_penalty`` > 0, the verl-agent preset), so that it is counted once."""
    return 0.0 if config.credit.invalid_penalty > 0 else config.policy.invalid_penalty


@dataclass
class Episode:
    """One rollout. Per-step lists have one entry per step t = 0..T-1 (state s_t, action a_t)."""

    task: Task
    group: int  # index of the task in this batch
    index: int  # rollout index within the group
    states: list[str] = field(default_factory=list)  # kappa(s_t)
    observations: list[str] = field(default_factory=list)
    actions: list[str | None] = field(default_factory=list)  # None: invalid reply (no-op)
    rewards: list[float] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    samples: list[Any] = field(default_factory=list)  # the policy's training samples
    invalid: list[bool] = field(default_factory=list)
    oracle: list[bool | None] = field(default_factory=list)  # action on a shortest plan (oracle on)
    subgoals: list[tuple[str, ...]] = field(default_factory=list)  # true subgoals reached by step t
    final_state: str = ""  # kappa of the state after the last step
    won: bool = False
    done: bool = False  # the engine ended the episode (WebShop: a purchase), not the step limit
    score: float = 0.0  # outcome in [0, 1]
    error: str | None = None

    @property
    def length(self) -> int:
        return len(self.actions)

    @property
    def errored(self) -> bool:
        return self.error is not None


@dataclass
class RolloutStats:
    steps: int = 0
    policy_s: float = 0.0
    env_s: float = 0.0
    cache_hits: int = 0  # steps answered by the environment's transition cache (ALFWorld)


def lane_slots(num_groups: int, group_size: int, lanes: int) -> list[list[int]]:
    """The slots of each lane: groups split into ``lanes`` contiguous blocks (no empty lane)."""
    lanes = max(1, min(lanes, num_groups))
    bounds = [lane * num_groups // lanes for lane in range(lanes + 1)]
    return [list(range(bounds[lane] * group_size, bounds[lane + 1] * group_size)) for lane in range(lanes)]


def run_episodes(policy, venv: VectorEnv, tasks: Sequence[Task], group_size: int, *, max_steps: int,
                 success_reward: float, invalid_penalty: float, greedy: bool = False,
                 temperature: float | None = None, stats: RolloutStats | None = None, lanes: int = 1) -> list[Episode]:
    """Play ``group_size`` episodes of each task, batched; episodes ordered task by task.

    With ``lanes`` > 1 (and an env that steps a subset of its episodes) the groups are split into
    lanes that take turns: the policy acts for one lane while the engine steps the others
    (``VectorEnv.step_async``; in worker processes that is on another core). Each lane makes one
    batched policy call per step; actions are drawn lane after lane, step by step, so the order
    of random draws is that of one call over all episodes."""
    if group_size < 1:
        raise ValueError(f"group_size: must be >= 1, got {group_size}")
    if len(tasks) * group_size > venv.num_envs:
        raise ValueError(f"{len(tasks)} tasks x {group_size} rollouts exceed the {venv.num_envs} environments")
    stats = stats if stats is not None else RolloutStats()
    env_tasks = [t for t in tasks for _ in range(group_size)]
    episodes = [Episode(task=t, group=e // group_size, index=e % group_size) for e, t in enumerate(env_tasks)]
    t0 = time.perf_counter()
    obs = venv.reset(env_tasks)
    stats.env_s += time.perf_counter() - t0
    histories: list[list[tuple[str, str]]] = [[] for _ in env_tasks]

    def record(e: int, res: StepResult | None) -> bool:
        """Record episode ``e``'s step result (reward convention of the module docstring); True when it is over."""
        ep = episodes[e]
        if res is None:
            res = StepResult(obs[e], 0.0, True, False, 0.0, error="environment returned no result for an active episode")
        invalid = bool(res.invalid) or ep.actions[-1] is None
        ep.won, ep.score, done = bool(res.won), float(res.score), bool(res.done)
        ep.done = done
        reward = success_reward if (done and res.won) else 0.0
        if res.error is not None:
            ep.error, done = res.error, True
        histories[e].append((obs[e].text, ep.actions[-1] or ""))
        obs[e] = res.observation
        ep.rewards.append(reward - (invalid_penalty if invalid else 0.0))
        ep.invalid.append(invalid)
        ep.subgoals.append(tuple(res.subgoals))
        ep.final_state = res.observation.state_key
        stats.steps += 1
        stats.cache_hits += bool(res.info.get("cache_hit"))
        return done or ep.length >= max_steps  # truncated (the engine may count no-op steps differently)

    turns = deque((slots, None) for slots in lane_slots(len(tasks), group_size, lanes if venv.partial_steps else 1))
    while turns:  # (a lane's active slots, its step in flight or None)
        active, pending = turns.popleft()
        if pending is not None:
            t0 = time.perf_counter()
            results = pending()
            stats.env_s += time.perf_counter() - t0
            active = [e for e in active if not record(e, results[e])]
        if not active:
            continue
        t0 = time.perf_counter()
        acts = policy.act([obs[e] for e in active], [histories[e] for e in active],
                          [episodes[e].length for e in active], greedy=greedy, temperature=temperature)
        stats.policy_s += time.perf_counter() - t0
        commands: list[str | None] = [None] * len(env_tasks)
        for e, sample in zip(active, acts):
            ep, o = episodes[e], obs[e]
            ep.states.append(o.state_key)
            ep.observations.append(o.text)
            ep.actions.append(sample.action)
            ep.logps.append(float(sample.logp))
            ep.samples.append(sample.sample)
            ep.oracle.append(sample.action in o.oracle_actions if o.oracle_actions else None)
            commands[e] = sample.action if sample.action is not None else INVALID_ACTION
        t0 = time.perf_counter()
        turns.append((active, venv.step_async(commands)))
        stats.env_s += time.perf_counter() - t0
    return episodes


def expert_walkthroughs(venv: VectorEnv, tasks: Sequence[Task], max_steps: int,
                        log: Callable[[str], None] | None = None) -> tuple[list[Any], int]:
    """Play each task once following the oracle's first action (venv made with oracle=True).
    Returns the expert steps (trainer.warmstart.ExpertStep) and the number of won walkthroughs.
    An episode whose oracle has no action (the handcoded expert's next command is not admissible) is
    stepped with a no-op while another episode of its chunk is live, and not recorded for that step;
    after a no-op the expert may have an admissible command again, so such a walkthrough's outcome
    depends on its chunk's other games (docs/envs.md, "Expert walkthroughs and their chunk"). ``log``
    gets a progress line about every 10 %."""
    from milegpo_cli.trainer.warmstart import ExpertStep

    steps: list[ExpertStep] = []
    won = 0
    every = max(1, len(tasks) // 10)  # walkthroughs between progress lines
    for start in range(0, len(tasks), venv.num_envs):
        chunk = list(tasks[start:start + venv.num_envs])
        obs = venv.reset(chunk)
        histories: list[list[tuple[str, str]]] = [[] for _ in chunk]
        live = set(range(len(chunk)))  # not done in the engine
        while any(obs[e].oracle_actions and len(histories[e]) < max_steps for e in live):
            commands: list[str | None] = [None] * len(chunk)
            for e in live:
                if obs[e].oracle_actions and len(histories[e]) < max_steps:
                    commands[e] = obs[e].oracle_actions[0]
                    steps.append(ExpertStep(obs[e], tuple(histories[e]), len(histories[e]), commands[e]))
                else:
                    commands[e] = INVALID_ACTION
            results = venv.step(commands)
            for e in list(live):
                res = results[e]
                if commands[e] != INVALID_ACTION:
                    histories[e].append((obs[e].text, commands[e]))
                    won += int(res.done and res.won)
                obs[e] = res.observation
                if res.done or res.error is not None:
                    live.discard(e)
        done = start + len(chunk)
        if log is not None and (done == len(tasks) or done // every != start // every):
            log(f"  expert walkthroughs {done}/{len(tasks)} ({won} won, {len(steps)} steps)")
    return steps, won
