"""Estimators by name and the single entry point ``compute_advantages``."""
from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from .batch import RolloutBatch
from .config import CreditConfig, canonical_drop
from .gigpo import gigpo
from .graphgpo import graphgpo
from .hgpo import hgpo
from .identical import zero_identical_groups
from .memory import Memory
from .grpo import grpo
from .milegpo import milegpo_v2
from .milegpo_v3 import milegpo_v3
from .oracle import oracle_milestones
from .paper import milegpo_paper
from .result import CreditResult


FORMULATION = {"v3": milegpo_v3, "v2": milegpo_v2, "paper": milegpo_paper}


def milegpo(batch: RolloutBatch, config: CreditConfig, drop: frozenset, memory: Memory | None = None) -> CreditResult:
    """MileGPO in the formulation the config selects (v3, v2 or paper; docs/algorithms.md); v3 takes the memory."""
    if config.formulation == "v3":
        return milegpo_v3(batch, config, drop, memory)
    return FORMULATION[config.formulation](batch, config, drop)


ESTIMATORS: dict[str, Callable[[RolloutBatch, CreditConfig, frozenset], CreditResult]] = {
    "grpo": grpo, "gigpo": gigpo, "graphgpo": graphgpo, "milegpo": milegpo, "hgpo": hgpo,
}
ALGORITHMS = tuple(ESTIMATORS)  # trainable (run.algo); the one list of them
BASELINES = tuple(a for a in ALGORITHMS if a != "milegpo")
DIAGNOSTIC = {"oracle-milestones": oracle_milestones}  # needs the true subgoals: reference rows only
ESTIMATORS.update(DIAGNOSTIC)


def compute_advantages(batch: RolloutBatch, algo: str, config: CreditConfig | None = None,
                       drop: Iterable[str] = frozenset(), memory: Memory | None = None) -> CreditResult:
    """Per-step advantages of ``algo`` for ``batch``.

    ``drop`` (united with ``config.drop``) names MileGPO components to ablate; other estimators
    have no components and ignore it (so an ablation sweep can run its baselines unchanged).
    ``config.zero_identical``: the steps of a group of identical rollouts get 0 (credit/identical.py).
    ``memory``: MileGPO v3's memory from earlier batches (credit/memory.py; used with ``config.memory``).
    """
    if algo not in ESTIMATORS:
        raise ValueError(f"algo: unknown algorithm {algo!r}; allowed: {', '.join(ESTIMATORS)}")
    config = config or CreditConfig()
    dropped = canonical_drop(drop) | canonical_drop(config.drop)
    if not np.isfinite(batch.outcome).all() or not np.isfinite(batch.reward).all():
        raise ValueError("batch: outcomes and rewards must be finite")
    result = milegpo(batch, config, dropped, memory) if algo == "milegpo" else ESTIMATORS[algo](batch, config, dropped)
    return zero_identical_groups(batch, result) if config.zero_identical else result
