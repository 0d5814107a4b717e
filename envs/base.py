"""The environment interface shared by ALFWorld and WebShop (DESIGN.md section 4).

An environment package exposes an :class:`EnvSuite` (task lists per split, a factory for
vectorised environments, a text corpus for the local tokenizer). A :class:`VectorEnv` steps
several episodes at once, so that the N rollouts of a group run as one batch.

Environments know nothing of policies, credit assignment or storage.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence


class EnvError(ValueError):
    """Bad input to an environment (unknown split, task type, malformed task...)."""


@dataclass(frozen=True)
class Task:
    """One task instance. The N rollouts of a group share one Task (same initial state)."""

    task_id: str  # stable id, unique within the suite (e.g. "alfworld/ood/pick_heat/00017")
    split: str  # "train" | "id" | "ood" (or the official split name)
    task_type: str  # e.g. "pick_heat_then_place_in_recep"; WebShop: the product category
    payload: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)  # env-specific, JSON-serialisable


@dataclass(frozen=True)
class Observation:
    """What the agent sees before choosing an action."""

    text: str  # the current observation text
    task: str  # the task description ("Your task is to: put a hot apple in countertop.")
    admissible: tuple[str, ...]  # admissible commands in this state
    state_key: str  # kappa(s): canonical key, equal for identical situations in different rollouts
    oracle_actions: tuple[str, ...] | None = None  # actions on a shortest plan from here (oracle on), else None


@dataclass(frozen=True)
class StepResult:
    observation: Observation  # the next observation (meaningless text once done, but state_key set)
    reward: float  # environment reward of this step (ALFWorld: 1 on the winning step; WebShop: score on buy)
    done: bool  # episode over (won, bought, or max_steps reached)
    won: bool  # success of the episode so far
    score: float  # outcome in [0, 1] (ALFWorld: 1.0 if won else 0.0; WebShop: the purchase score)
    invalid: bool = False  # the action was not admissible (the engine answered as a no-op)
    subgoals: tuple[str, ...] = ()  # true subgoals newly reached by this step (e.g. "picked", "heated")
    error: str | None = None  # traceback text if the engine failed during this step (episode ends)
    info: dict[str, Any] = field(default_factory=dict)


class VectorEnv(ABC):
    """A batch of independent episodes stepped together."""

    @property
    @abstractmethod
    def num_envs(self) -> int: ...

    @abstractmethod
    def reset(self, tasks: Sequence[Task]) -> list[Observation]:
        """Start len(tasks) <= num_envs episodes (the same Task may repeat: a group)."""

    @abstractmethod
    def step(self, actions: Sequence[str | None]) -> list[StepResult | None]:
        """Apply one action per active episode; None for an episode that is already done
        (its result is None too)."""

    def step_async(self, actions: Sequence[str | None]) -> Callable[[], list[StepResult | None]]:
        """Start ``step(actions)`` and return a function that waits for its results. An engine that
        steps in worker processes returns at once, so the caller can run the policy on other
        episodes meanwhile; calls are answered in order. With ``partial_steps`` an active episode
        may be left out (None) of a call and stepped by a later one. Default: steps now."""
        results = self.step(actions)
        return lambda: results

    partial_steps: bool = False  # step() accepts None for an active episode (it is not stepped)

    def close(self) -> None:  # noqa: B027 - optional
        pass


class EnvSuite(ABC):
    """An environment family with its splits, configured from the recipe's [env] section."""

    name: str
    max_steps: int
    # commands that change nothing in the world and tell the agent nothing new (ALFWorld's "look").
    # The expert-action probe leaves out expert steps that issue them.
    no_op_commands: frozenset[str] = frozenset()

    @abstractmethod
    def tasks(self, split: str, n: int, seed: int = 0, *, start: int = 0) -> list[Task]:
        """A fixed, reproducible list of n tasks of a split (same seed, same list): the split's tasks
        start..start+n-1 in an order fixed by ``seed``, so that disjoint ranges give disjoint tasks."""

    @abstractmethod
    def split_size(self, split: str) -> int:
        """How many tasks ``tasks(split, ...)`` can draw from (start + n <= split_size)."""

    @abstractmethod
    def make_vector_env(self, num_envs: int, *, oracle: bool = False) -> VectorEnv:
        """Environments for num_envs parallel episodes; oracle=True fills Observation.oracle_actions."""

    @abstractmethod
    def text_corpus(self) -> Iterable[str]:
        """Sentences of this environment's text, for training the local tokenizer."""

    @abstractmethod
    def describe_splits(self) -> dict[str, Any]:
        """JSON-serialisable description of the split definitions (stored with every run)."""

    @property
    def task_types(self) -> tuple[str, ...]:
        return ()

    def task_positions(self, split: str, task_types: Sequence[str]) -> list[int]:
        """The positions p (``tasks(split, 1, start=p)``) of the split's tasks whose type is one of
        ``task_types``, ascending, found without building a task. Default: this suite cannot tell."""
        raise EnvError(f"{self.name}: tasks cannot be chosen by task type")

    def close(self) -> None:  # noqa: B027 - optional
        pass
