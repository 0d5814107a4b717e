"""A synthetic corridor task family with oracle labels, for credit evidence without an engine (issue 42).

Task k is a corridor of ``L_k`` rooms (6 to 16) with side closets in some rooms: the agent starts in
room 0 and wins on reaching room ``L_k`` within ``max_steps``. In a room it may go forward (the
oracle's action), go back, wait, or open the room's closet (a recurring trap: inside, only
``leave closet`` is the oracle's action). Room names carry the task, so rollouts of one task share
their states across groups and iterations and those of different tasks do not. The behaviour policy
is ``credit_recording.expert_or_random(p)``: the oracle's action with probability 1 - p, else a uniform
admissible one. Records have the fields of ``credit_recording.record_group``.
"""
from __future__ import annotations

import random

from envs.base import Observation
from milegpo_cli.experiments.credit_recording import expert_or_random

FORWARD, BACK, WAIT, OPEN, LEAVE = "go forward", "go back", "wait", "open closet", "leave closet"


def corridor(task: int, seed: int) -> tuple[int, set[int]]:
    """Length and closet rooms of task ``task`` (fixed by ``seed`` and the task index)."""
    rng = random.Random(f"corridor|{seed}|{task}")
    length = rng.randint(6, 16)
    return length, {i for i in range(length) if rng.random() < 0.4}


def state_key(task: int, room: int, inside: bool) -> str:
    return f"corridor {task} {'closet' if inside else 'room'} {room}"


def play(task: int, length: int, closets: set[int], p: float, rng: random.Random, max_steps: int,
         success_reward: float = 10.0) -> dict:
    """One rollout: per-step state, action, reward and oracle label; success when room ``length`` is reached."""
    room, inside, steps, won = 0, False, [], False
    for _ in range(max_steps):
        state = state_key(task, room, inside)
        admissible = (LEAVE, WAIT) if inside else (FORWARD, WAIT) + ((BACK,) if room else ()) + (
            (OPEN,) if room in closets else ())
        oracle = LEAVE if inside else FORWARD
        action = expert_or_random(Observation(state, f"reach room {length}", admissible, state, (oracle,)), p, rng)
        if action == FORWARD:
            room += 1
        elif action == BACK:
            room -= 1
        elif action in (OPEN, LEAVE):
            inside = action == OPEN
        won = room == length
        steps.append({"state": state, "action": action, "reward": success_reward if won else 0.0,
                      "oracle_good": action == oracle, "subgoals": []})
        if won:
            break
    return {"outcome": float(won), "success": won, "final_state": state_key(task, room, inside), "steps": steps}


def record_group(task: int, p: float, group_size: int, seed: int, iteration: int, max_steps: int) -> list[dict]:
    """``group_size`` rollouts of corridor ``task`` in ``iteration`` (fresh draws per iteration)."""
    length, closets = corridor(task, seed)
    name = f"corridor-{seed}-{task}"
    out = []
    for i in range(group_size):
        rec = play(task, length, closets, p, random.Random(f"{name}|{iteration}|{i}"), max_steps)
        out.append({"group": f"{name}|it={iteration}", "rollout": i, "task_id": name, "task_type": "corridor",
                    "split": "synthetic", "p": p, "error": None, "task": name, "iteration": iteration, **rec})
    return out
