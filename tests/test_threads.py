"""Torch threads of a training process (trainer/threads.py)."""
from __future__ import annotations

import torch

from milegpo_cli.trainer.threads import MAX_THREADS_ENV, set_threads, thread_budget, torch_threads


def test_thread_budget_is_capped_by_the_parallel_share(monkeypatch):
    monkeypatch.delenv(MAX_THREADS_ENV, raising=False)
    assert thread_budget(2) == 2
    monkeypatch.setenv(MAX_THREADS_ENV, "1")  # ablate --parallel 2 on 2 cores
    assert thread_budget(2) == 1 and thread_budget(1) == 1


def test_torch_threads_sets_and_restores(monkeypatch):
    monkeypatch.delenv(MAX_THREADS_ENV, raising=False)
    before = torch.get_num_threads()
    try:
        set_threads(2)
        with torch_threads(1):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with torch_threads(0):  # 0: as they are
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
