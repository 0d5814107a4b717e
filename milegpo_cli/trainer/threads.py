"""The thread plan of a training process, from the cores it may use (milegpo_cli/cores.py).

:func:`plan_threads` decides it once per command (``train``, ``rollout``, ``policy build-base``):
``run.threads`` for the update and the probe, ``rollout.threads`` while rolling out beside the
ALFWorld engine workers, the number of those workers and the rollout lanes, all capped by the
process's cores (affinity, cgroup quota, the member share that ``milegpo ablate --parallel K`` passes
in ``MILEGPO_CORES``). The plan is handed to the iteration and the evaluation; the config is not
rewritten. After each :meth:`ThreadPlan.follow_load` the torch threads are also capped by the cores
other processes leave free: OpenMP threads that find their core busy slow a process down many times
(docs/performance.md). Float sums of a capped run may differ from an uncapped one in the last bits.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from milegpo_cli import cores

CORES_ENV = cores.CORES_ENV


@dataclass
class ThreadPlan:
    """How one process uses its cores: ``threads`` (run.threads) torch threads for the update and the
    probe, ``rollout`` (cores.RolloutPlan) while rolling out, on ``cores`` cores; ``others`` is the load
    (cores) other processes put on them at the last :meth:`follow_load` (0 before any)."""

    threads: int
    rollout: cores.RolloutPlan
    cores: int
    others: float = 0.0

    def budget(self, threads: int) -> int:
        """``threads``, capped by the cores and by the cores the last load reading left free."""
        return cores.thread_count(threads, self.cores, self.others)

    def apply(self) -> None:
        """Torch threads for the update and the probe (``run.threads``, capped)."""
        torch.set_num_threads(self.budget(self.threads))

    def follow_load(self, meter: cores.LoadMeter) -> dict[str, float]:
        """Read other processes' load since the last reading and set the update's threads after it.
        Returns iteration metrics of the machine, not of the run: ``host_load_others`` (cores kept busy
        by other processes), ``host_cores`` (this process's cores) and ``host_cores_free``."""
        self.others = meter.others_busy()
        self.apply()
        return {"host_load_others": round(self.others, 3), "host_cores": float(self.cores),
                "host_cores_free": float(cores.free_cores(self.cores, self.others))}

    @contextmanager
    def rolling_out(self):
        """Run the block with the rollout's torch threads (capped), then restore them."""
        with torch_threads(self.budget(self.rollout.threads)):
            yield


@contextmanager
def torch_threads(threads: int):
    """Run the block with exactly ``threads`` torch threads, then restore them."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def plan_threads(config) -> ThreadPlan:
    """The thread plan of ``config`` on this process's cores: the rollout's threads, lanes and ALFWorld
    engine workers from :func:`milegpo_cli.cores.rollout_plan` (a runtime decision, not stored).
    Engine workers that are Ray actors (``workers_backend = "ray"``) run on the cluster's nodes, not
    on these cores: their number is kept (``workers < 0``: one per core here) and the rollout threads
    take every core. WebShop has no engine workers: its rollout keeps ``rollout.threads`` (0:
    ``run.threads``) and ``rollout.lanes``."""
    r, have = config.rollout, cores.process_cores()
    threads = r.threads or config.run.threads
    if config.env.name != "alfworld":
        plan = cores.RolloutPlan(threads, 0, r.lanes)
    elif config.env.alfworld.workers_backend == "ray":
        workers = config.env.alfworld.workers if config.env.alfworld.workers >= 0 else have
        plan = cores.RolloutPlan(max(1, min(threads, have)), workers, r.lanes)
    else:
        plan = cores.rollout_plan(threads, config.env.alfworld.workers, r.lanes, have)
    return ThreadPlan(config.run.threads, plan, have)
