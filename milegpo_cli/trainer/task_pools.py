"""Which tasks of the train split each use of training draws from, kept disjoint by construction.

The train split's S tasks (``suite.split_size("train")``; ``suite.tasks(split, n, seed, start=)``
returns tasks start..start+n-1) are cut into three ranges, so that the supervised data never
contains a task that PPO trains on, and no run's PPO pool overlaps another seed's:

    PPO pools      [0, S/2)       block ``seed mod (S/2 // P)`` of P = rollout.train_tasks tasks
    warm start     [S/2, 3S/4)    (per-run supervised warm start, ``[warmstart]``)
    base policy    [3S/4, S)      (the cached base policy, ``[base]``)

With the default 2,000 train tasks (ALFWorld ``train_games``, WebShop's train instructions) these are
0-999, 1000-1499 and 1500-1999. The id and ood splits (evaluation) are separate pools of their own.

``run.task_types`` narrows PPO to tasks of those types: a seed's pool is then its block of P among
the PPO range's tasks of those types (``suite.task_positions``: ALFWorld's generator cycles the six
types, so no game of another type is built); the warm start and the base policy are left as they are.
"""
from __future__ import annotations

from milegpo_cli.errors import ConfigError


def ranges(size: int) -> dict[str, tuple[int, int]]:
    """The three ranges of a train split of ``size`` tasks."""
    return {"ppo": (0, size // 2), "warmstart": (size // 2, 3 * size // 4), "base": (3 * size // 4, size)}


def _take(suite, use: str, key: str, n: int, seed: int, block: int | None = None,
          task_types: tuple[str, ...] = ()) -> list:
    lo, hi = ranges(suite.split_size("train"))[use]
    positions = range(lo, hi)
    if task_types:
        positions = [p for p in suite.task_positions("train", task_types) if lo <= p < hi]
    held = f"{len(positions)}" + (" of run.task_types" if task_types else "")
    if block is not None:  # PPO: the seed's own block of n tasks
        blocks = len(positions) // n
        if blocks < 1:
            raise ConfigError(f"{key}: {n} tasks asked, the PPO range of the train split holds {held}")
        positions = positions[(block % blocks) * n:]
    if n > len(positions):
        raise ConfigError(f"{key}: {n} tasks asked, the {use} range of the train split holds {held}")
    if not task_types:
        return suite.tasks("train", n, seed=seed, start=positions[0])
    return tasks_at(suite, "train", positions[:n], seed)


def tasks_at(suite, split: str, positions, seed: int) -> list:
    """The split's tasks at these positions, in the order given."""
    return [suite.tasks(split, 1, seed=seed, start=p)[0] for p in positions]


def ppo_pool(suite, n: int, seed: int, task_types: tuple[str, ...] = ()) -> list:
    """The PPO task pool of run seed ``seed`` (seeds 0 .. S/2 // n - 1 get disjoint pools; with
    ``task_types``, S/2 counts the PPO range's tasks of those types)."""
    return _take(suite, "ppo", "rollout.train_tasks", n, seed, block=seed, task_types=task_types)


def warmstart_tasks(suite, n: int, seed: int) -> list:
    return _take(suite, "warmstart", "warmstart.episodes", n, seed)


def base_tasks(suite, n: int) -> list:
    return _take(suite, "base", "base.walkthroughs", n, seed=0)
