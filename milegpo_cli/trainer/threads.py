"""Torch threads and rollout workers of a training process, from the cores it may use (milegpo_cli/cores.py).

``run.threads`` for the update and the probe, ``rollout.threads`` while rolling out beside the engine
workers; both capped by the process's cores (affinity, cgroup quota, the member share that ``milegpo
ablate --parallel K`` passes in ``MILEGPO_CORES``) and, after each :func:`follow_load`, by the cores
other processes leave free: OpenMP threads that find their core busy slow a process down many times
(docs/performance.md). Float sums of a capped run may differ from an uncapped one in the last bits.
"""
from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import torch

from milegpo_cli import cores

CORES_ENV = cores.CORES_ENV
_state: dict = {"others": 0.0}  # other processes' load (cores) at the last reading


def budget_cores() -> int:
    """The cores this process may use (affinity, cgroup quota, member share: read each time, cheap)."""
    return cores.process_cores()


def thread_budget(threads: int) -> int:
    """``threads``, capped by this process's cores and by the cores the last load reading left free."""
    return cores.thread_count(threads, budget_cores(), _state["others"])


def follow_load(meter: cores.LoadMeter) -> dict[str, float]:
    """Read other processes' load since the last reading; later thread settings follow it. Returns
    iteration metrics of the machine, not of the run: ``host_load_others`` (cores kept busy by other
    processes), ``host_cores`` (this process's cores) and ``host_cores_free``."""
    _state["others"] = meter.others_busy()
    return {"host_load_others": round(_state["others"], 3), "host_cores": float(budget_cores()),
            "host_cores_free": float(cores.free_cores(budget_cores(), _state["others"]))}


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


def fit_to_cores(config):
    """``config`` with the rollout's threads, lanes and ALFWorld engine workers sized to this
    process's cores (:func:`milegpo_cli.cores.rollout_plan`); a runtime setting, not stored. Engine
    workers that are Ray actors (``workers_backend = "ray"``) run on the cluster's nodes, not on these
    cores: their number is kept (``workers < 0``: one per core here) and the rollout threads take every core."""
    if config.env.name != "alfworld":
        return config
    r, env = config.rollout, config.env
    threads, have = r.threads or config.run.threads, budget_cores()
    if env.alfworld.workers_backend == "ray":
        workers = env.alfworld.workers if env.alfworld.workers >= 0 else have
        plan = cores.RolloutPlan(max(1, min(threads, have)), workers, r.lanes)
    else:
        plan = cores.rollout_plan(threads, env.alfworld.workers, r.lanes, have)
    return dataclasses.replace(
        config, rollout=dataclasses.replace(r, threads=plan.threads, lanes=plan.lanes),
        env=dataclasses.replace(env, alfworld=dataclasses.replace(env.alfworld, workers=plan.workers)))
