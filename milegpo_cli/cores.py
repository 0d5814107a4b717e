"""The cores a training process may use, and how busy other processes keep them (docs/performance.md,
"Cores on a shared machine").

cores = min(CPUs in the affinity mask, floor(cgroup CPU quota), the member share ``MILEGPO_CORES``)
(at least 1); ``milegpo ablate --parallel K`` gives each member cores // K of its own cores. Torch
threads = min(requested, cores, cores free now), where a core is free unless other processes (not
this one, not its engine workers) kept more than ``BUSY_SLACK`` of it busy over the last window:
OpenMP threads wait for each other at every parallel region, so one thread on a shared core holds
the others back many times over. Engine worker processes: min(requested, cores); with one core the
engines step in-process (``workers = 0``) and the rollout does not pipeline (``lanes = 1``).
Linux reads (/proc, /sys/fs/cgroup); elsewhere the affinity falls back to ``os.cpu_count()`` and the
load to 0. Pure functions take the readings as arguments.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

CORES_ENV = "MILEGPO_CORES"  # cores granted to this process by its parent (ablate --parallel)
BUSY_SLACK = 0.25  # a core stays "free" while other processes keep at most this share of it busy
MIN_WINDOW_S = 0.1  # shortest window a load reading is taken over


@dataclass(frozen=True)
class RolloutPlan:
    """How a rollout uses its cores: torch threads of the policy, engine worker processes, lanes."""

    threads: int
    workers: int
    lanes: int


def usable_cores(affinity: int, quota: float | None = None, share: int | None = None) -> int:
    """min(affinity, floor(quota), share), at least 1 (quota: cgroup CPU quota in cores, None: none)."""
    cores = affinity
    if quota is not None:
        cores = min(cores, math.floor(quota + 1e-9))
    if share is not None and share > 0:
        cores = min(cores, share)
    return max(1, cores)


def free_cores(cores: int, others_busy: float) -> int:
    """Cores of ``cores`` not kept busy by other processes (``others_busy``: their load in cores over
    the last window, on our CPUs); at least 1."""
    return max(1, min(cores, math.floor(cores - others_busy + BUSY_SLACK + 1e-9)))


def thread_count(requested: int, cores: int, others_busy: float = 0.0) -> int:
    """Torch intra-op threads: ``requested``, capped by the free cores."""
    return max(1, min(requested, free_cores(cores, others_busy)))


def rollout_plan(threads: int, workers: int, lanes: int, cores: int) -> RolloutPlan:
    """The rollout's threads, engine workers and lanes on ``cores`` cores (workers < 0: one per core).
    With one core the engines step in-process and the lanes merge: nothing runs beside the policy."""
    if cores <= 1:
        return RolloutPlan(1, 0, 1)
    workers = cores if workers < 0 else min(workers, cores)
    return RolloutPlan(max(1, min(threads, cores - 1 if workers else cores)), workers, lanes)


def member_share(cores: int, members: int) -> int:
    """Cores of each of ``members`` processes run side by side on ``cores`` cores (at least 1)."""
    return max(1, cores // max(1, members))


# --- readings --------------------------------------------------------------------------------------


def affinity_cpus() -> set[int]:
    """The CPUs this process may run on."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def _cgroup_dirs(root: Path, proc_cgroup: str) -> list[Path]:
    """The folders of this process's cpu cgroup and its ancestors, leaf first (v2 and v1 layouts)."""
    dirs = []
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "":
            bases = [root]  # v2 unified hierarchy
        elif "cpu" in controllers.split(","):
            bases = [root / controllers, root / "cpu", root / "cpu,cpuacct"]
        else:
            continue
        for base in bases:
            path = base / rel.lstrip("/")
            while True:
                dirs.append(path)
                if path == base:
                    break
                path = path.parent
    return dirs


def parse_quota(cpu_max: str | None = None, cfs_quota: str | None = None, cfs_period: str | None = None) -> float | None:
    """Cores allowed by one cgroup: v2 ``cpu.max`` ("max 100000" or "QUOTA PERIOD"), or v1
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (quota -1: none). None when unlimited."""
    if cpu_max is not None:
        quota, _, period = cpu_max.strip().partition(" ")
        if quota == "max" or not period:
            return None
        return int(quota) / int(period)
    if cfs_quota is not None and cfs_period is not None and int(cfs_quota) > 0:
        return int(cfs_quota) / int(cfs_period)
    return None


def cgroup_quota(root: str | Path = "/sys/fs/cgroup", proc_cgroup: str | None = None) -> float | None:
    """The tightest CPU quota (in cores) over this process's cgroup and its ancestors; None: none."""
    root = Path(root)
    try:
        text = proc_cgroup if proc_cgroup is not None else Path("/proc/self/cgroup").read_text()
    except OSError:
        return None
    found = []
    for d in _cgroup_dirs(root, text):
        try:
            if (d / "cpu.max").is_file():
                q = parse_quota(cpu_max=(d / "cpu.max").read_text())
            elif (d / "cpu.cfs_quota_us").is_file():
                q = parse_quota(cfs_quota=(d / "cpu.cfs_quota_us").read_text(),
                                cfs_period=(d / "cpu.cfs_period_us").read_text())
            else:
                continue
        except (OSError, ValueError):
            continue
        if q is not None:
            found.append(q)
    return min(found) if found else None


def granted_share(environ=os.environ) -> int | None:
    """The member share a parent process granted (``MILEGPO_CORES``), None when unset."""
    value = environ.get(CORES_ENV, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def process_cores() -> int:
    """:func:`usable_cores` of this process: affinity, cgroup quota, member share."""
    return usable_cores(len(affinity_cpus()), cgroup_quota(), granted_share())


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def busy_ticks(proc_stat: str, cpus: set[int]) -> int:
    """Busy clock ticks (user, nice, system, irq, softirq, steal) of ``cpus`` in a /proc/stat text."""
    total = 0
    for line in proc_stat.splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in (fields + ["0"] * 8)[:8])
            total += user + nice + system + irq + softirq + steal
    return total


def _stat_fields(pid: int | str) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # fields from 3 (state) on; comm may hold spaces


def own_ticks(pid: int | None = None) -> int:
    """CPU ticks of this process (all threads, waited-for children) and of its live descendants."""
    pid = pid or os.getpid()
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            f = _stat_fields(entry.name)
            if f is not None:
                parents[int(entry.name)] = int(f[1])
                ticks[int(entry.name)] = sum(int(x) for x in f[11:15])  # utime stime cutime cstime
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += ticks.get(p, 0)
        todo.extend(c for c, parent in parents.items() if parent == p)
    return total


class LoadMeter:
    """Load of other processes on this process's CPUs, in cores, between two readings:
    (busy ticks of our CPUs - ticks of this process tree) / elapsed ticks. 0 where /proc is missing."""

    def __init__(self) -> None:
        self.cpus = affinity_cpus()
        self._last = self._read()

    def _read(self) -> tuple[float, int, int] | None:
        try:
            return time.monotonic(), busy_ticks(Path("/proc/stat").read_text(), self.cpus), own_ticks()
        except (OSError, ValueError):
            return None

    def others_busy(self) -> float:
        """Other processes' load (cores) since the last call (a window of at least ``MIN_WINDOW_S``)."""
        if self._last is None:
            return 0.0
        wait = self._last[0] + MIN_WINDOW_S - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        now = self._read()
        if now is None:
            return 0.0
        (t0, busy0, own0), (t1, busy1, own1) = self._last, now
        self._last = now
        return others_load(busy1 - busy0, own1 - own0, t1 - t0, _TICK)


def others_load(busy_ticks_delta: int, own_ticks_delta: int, seconds: float, tick_hz: int = 100) -> float:
    """Cores kept busy by other processes over a window: (busy - own) ticks / (seconds x tick_hz)."""
    if seconds <= 0:
        return 0.0
    return max(0.0, (busy_ticks_delta - own_ticks_delta) / (seconds * tick_hz))
