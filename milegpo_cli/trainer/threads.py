"""Torch threads of a training process: ``run.threads`` for the update, ``rollout.threads`` while
rolling out beside the engine workers, and a cap for processes that share the cores.

``milegpo ablate --parallel K`` runs K trainings side by side; each gets ``MILEGPO_MAX_THREADS`` =
cores / K, because OpenMP threads that find their core busy slow a process down many times
(docs/performance.md). Float sums of a capped run may differ from an uncapped one in the last bits.
"""
from __future__ import annotations

import os
from contextlib import contextmanager

import torch

MAX_THREADS_ENV = "MILEGPO_MAX_THREADS"


def thread_budget(threads: int) -> int:
    """``threads``, capped by ``MILEGPO_MAX_THREADS`` when it is set."""
    cap = int(os.environ.get(MAX_THREADS_ENV) or 0)
    return max(1, min(threads, cap)) if cap > 0 else threads


def set_threads(threads: int) -> None:
    torch.set_num_threads(thread_budget(threads))


@contextmanager
def torch_threads(threads: int):
    """Run the block with ``threads`` torch threads (0: as they are), then restore them."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(thread_budget(threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)
