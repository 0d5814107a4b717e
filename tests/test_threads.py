"""Cores, torch threads and rollout workers of a training process (milegpo_cli/cores.py, trainer/threads.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from milegpo_cli import cores
from milegpo_cli.config import load_config
from milegpo_cli.trainer.threads import CORES_ENV, ThreadPlan, plan_threads, torch_threads

ROOT = Path(__file__).resolve().parents[1]


def test_usable_cores_take_the_smallest_of_affinity_quota_and_share():
    assert cores.usable_cores(8) == 8
    assert cores.usable_cores(8, quota=2.5) == 2  # a fractional quota does not buy a thread
    assert cores.usable_cores(8, quota=0.5) == 1  # at least one
    assert cores.usable_cores(2, quota=4.0) == 2
    assert cores.usable_cores(8, quota=6.0, share=3) == 3
    assert cores.usable_cores(2, share=4) == 2


def test_threads_drop_to_one_when_another_process_holds_a_core():
    assert cores.thread_count(2, cores=2, others_busy=0.0) == 2
    assert cores.thread_count(2, cores=2, others_busy=0.2) == 2  # a little background noise
    assert cores.thread_count(2, cores=2, others_busy=0.5) == 1
    assert cores.thread_count(2, cores=2, others_busy=1.0) == 1  # one `while True: pass` beside it
    assert cores.thread_count(2, cores=2, others_busy=3.0) == 1  # never 0
    assert cores.thread_count(4, cores=8, others_busy=5.0) == 3
    assert cores.thread_count(1, cores=8, others_busy=0.0) == 1  # never more than asked


@pytest.mark.parametrize("total,members", [(2, 2), (2, 1), (8, 3), (16, 4), (3, 2)])
def test_member_shares_add_up_to_at_most_the_cores(total, members):
    share = cores.member_share(total, members)
    assert share >= 1 and members * share <= total
    assert members * (share + 1) > total  # and no whole core is left for nobody
    assert cores.usable_cores(total, share=share) == share  # what each member then uses


def test_rollout_plan_follows_the_cores():
    assert cores.rollout_plan(1, 2, 2, cores=2) == cores.RolloutPlan(threads=1, workers=2, lanes=2)  # the recipe
    assert cores.rollout_plan(1, 2, 2, cores=1) == cores.RolloutPlan(threads=1, workers=0, lanes=1)  # nothing beside it
    assert cores.rollout_plan(4, -1, 1, cores=3) == cores.RolloutPlan(threads=2, workers=3, lanes=1)  # a core for the engines
    assert cores.rollout_plan(2, 0, 1, cores=2) == cores.RolloutPlan(threads=2, workers=0, lanes=1)  # in-process engines


def test_cgroup_quotas_v1_v2_and_the_tightest_ancestor(tmp_path):
    assert cores.parse_quota(cpu_max="max 100000\n") is None
    assert cores.parse_quota(cpu_max="150000 100000\n") == 1.5
    assert cores.parse_quota(cfs_quota="-1\n", cfs_period="100000\n") is None
    assert cores.parse_quota(cfs_quota="200000", cfs_period="100000") == 2.0
    leaf = tmp_path / "v2" / "a" / "b"  # v2: the parent's limit binds the child
    leaf.mkdir(parents=True)
    (tmp_path / "v2" / "cpu.max").write_text("max 100000\n")
    (tmp_path / "v2" / "a" / "cpu.max").write_text("100000 100000\n")
    (leaf / "cpu.max").write_text("300000 100000\n")
    assert cores.cgroup_quota(tmp_path / "v2", "0::/a/b\n") == 1.0
    v1 = tmp_path / "v1" / "cpu,cpuacct" / "job"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("250000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cores.cgroup_quota(tmp_path / "v1", "4:memory:/x\n2:cpu,cpuacct:/job\n") == 2.5
    assert cores.cgroup_quota(tmp_path / "none", "0::/\n") is None


def test_load_of_other_processes_from_proc_stat():
    stat = ("cpu  10 0 10 100 0 0 0 0 0 0\ncpu0 100 5 20 900 3 1 1 2 0 0\ncpu1 50 0 10 900 0 0 0 0 0 0\n"
            "cpu2 999 0 0 0 0 0 0 0 0 0\nintr 1 2 3\n")
    assert cores.busy_ticks(stat, {0, 1}) == (100 + 5 + 20 + 1 + 1 + 2) + (50 + 10)  # idle, iowait not busy
    assert cores.others_load(busy_ticks_delta=150, own_ticks_delta=50, seconds=1.0, tick_hz=100) == 1.0
    assert cores.others_load(busy_ticks_delta=40, own_ticks_delta=60, seconds=1.0, tick_hz=100) == 0.0


def test_granted_share_reads_the_parent_s_env():
    assert cores.granted_share({CORES_ENV: "3"}) == 3
    assert cores.granted_share({CORES_ENV: ""}) is None and cores.granted_share({}) is None
    assert cores.granted_share({CORES_ENV: "0"}) is None


def test_the_real_readings_are_sane():
    cpus = cores.affinity_cpus()
    assert 1 <= len(cpus) <= (os.cpu_count() or 1)
    quota = cores.cgroup_quota()
    assert quota is None or quota > 0
    assert 1 <= cores.process_cores() <= len(cpus)
    meter = cores.LoadMeter()
    assert cores.own_ticks() >= 0
    load = meter.others_busy()  # sleeps to a window of MIN_WINDOW_S
    assert 0.0 <= load <= len(cpus) + 0.5


def _ticks(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    return sum(int(x) for x in text[text.rindex(")") + 2:].split()[11:13])  # utime stime


@pytest.mark.slow
def test_own_ticks_count_our_children_and_not_other_processes():
    """A CPU-bound child of this process is our own work; a process outside our tree is not."""
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        own0, c0 = cores.own_ticks(), _ticks(spin.pid)
        time.sleep(1.0)
        own1, c1 = cores.own_ticks(), _ticks(spin.pid)
    finally:
        spin.kill()
        spin.wait()
    assert c1 - c0 > 0 and own1 - own0 >= c1 - c0
    out = subprocess.run(  # orphaned at once: reparented away from this process tree
        [sys.executable, "-c", "import subprocess, sys; print(subprocess.Popen([sys.executable, '-c', 'while True: pass'], "
         "start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)"],
        capture_output=True, text=True, timeout=60)
    pid = int(out.stdout)
    try:
        own0, o0 = cores.own_ticks(), _ticks(pid)
        time.sleep(1.0)
        own1, o1 = cores.own_ticks(), _ticks(pid)
    finally:
        os.kill(pid, 9)
    assert o1 - o0 > own1 - own0


class _Busy:
    def __init__(self, load: float):
        self.load = load

    def others_busy(self):
        return self.load


def test_thread_budget_is_capped_by_the_share_and_the_load(monkeypatch):
    monkeypatch.setattr(cores, "affinity_cpus", lambda: {0, 1})
    monkeypatch.setattr(cores, "cgroup_quota", lambda: None)
    monkeypatch.delenv(CORES_ENV, raising=False)
    config = load_config("alfworld", ["run.threads=2"])
    assert plan_threads(config).budget(2) == 2
    monkeypatch.setenv(CORES_ENV, "1")  # ablate --parallel 2 on 2 cores
    assert plan_threads(config).budget(2) == 1 and plan_threads(config).budget(1) == 1
    monkeypatch.delenv(CORES_ENV)

    plan, before = plan_threads(config), torch.get_num_threads()
    try:
        m = plan.follow_load(_Busy(1.0))  # the update's threads follow the load at once
        assert m == {"host_load_others": 1.0, "host_cores": 2.0, "host_cores_free": 1.0}
        assert plan.budget(2) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_each_plan_holds_its_own_load_reading(monkeypatch):
    """The load reading lives in the plan handed to the iteration, not in module state: a second plan
    in the same process (a test, a bench, `rollout` after `train`) starts from no load."""
    monkeypatch.setattr(cores, "affinity_cpus", lambda: {0, 1})
    monkeypatch.setattr(cores, "cgroup_quota", lambda: None)
    monkeypatch.delenv(CORES_ENV, raising=False)
    config = load_config("alfworld", ["run.threads=2"])
    busy, fresh, before = plan_threads(config), plan_threads(config), torch.get_num_threads()
    try:
        busy.follow_load(_Busy(1.0))
    finally:
        torch.set_num_threads(before)
    assert (busy.others, busy.budget(2)) == (1.0, 1)
    assert (fresh.others, fresh.budget(2)) == (0.0, 2)


def test_the_plan_sizes_workers_and_lanes_and_leaves_the_config_as_it_is(monkeypatch):
    monkeypatch.setattr(cores, "affinity_cpus", lambda: {0, 1})
    monkeypatch.setattr(cores, "cgroup_quota", lambda: None)
    config = load_config("alfworld", [])
    monkeypatch.delenv(CORES_ENV, raising=False)
    assert plan_threads(config).rollout == cores.RolloutPlan(threads=1, workers=2, lanes=2)
    monkeypatch.setenv(CORES_ENV, "1")
    one = plan_threads(config)
    assert one == ThreadPlan(config.run.threads, cores.RolloutPlan(threads=1, workers=0, lanes=1), cores=1)
    assert one.budget(config.run.threads) == 1
    assert config.to_dict() == load_config("alfworld", []).to_dict()  # a runtime decision, not a config rewrite
    webshop = load_config("webshop", ["rollout.threads=0", "run.threads=2"])
    assert plan_threads(webshop).rollout == cores.RolloutPlan(threads=2, workers=0, lanes=webshop.rollout.lanes)


def test_engine_actors_are_not_capped_by_the_members_cores(monkeypatch):
    """``workers_backend = "ray"`` in a 1-core ``ablate --ray`` member ran no actor at all (the 1-core
    plan steps the engines in-process): the actors live on the cluster's nodes, their number stays."""
    monkeypatch.setattr(cores, "affinity_cpus", lambda: {0, 1})
    monkeypatch.setattr(cores, "cgroup_quota", lambda: None)
    monkeypatch.setenv(CORES_ENV, "1")
    config = load_config("alfworld", ["env.alfworld.workers_backend=\"ray\"", "env.alfworld.workers=3",
                                      "rollout.lanes=2"])
    assert plan_threads(config).rollout == cores.RolloutPlan(threads=1, workers=3, lanes=2)


def test_torch_threads_sets_and_restores(monkeypatch):
    monkeypatch.setattr(cores, "affinity_cpus", lambda: {0, 1})
    monkeypatch.setattr(cores, "cgroup_quota", lambda: None)
    monkeypatch.delenv(CORES_ENV, raising=False)
    before = torch.get_num_threads()
    try:
        plan = plan_threads(load_config("alfworld", ["run.threads=2", "rollout.threads=1"]))
        plan.apply()
        assert torch.get_num_threads() == 2
        with plan.rolling_out():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with torch_threads(1):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_omp_wait_policy_is_set_before_torch_loads():
    """A fresh interpreter: importing the package first makes torch's libgomp wait passively (spin
    count 0; unset, libgomp spins 300,000 times before it sleeps). libgomp prints what it read."""
    code = "import sys, milegpo_cli; assert 'torch' not in sys.modules; import torch; torch.ones(1)"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(PYTHONPATH=str(ROOT), OMP_DISPLAY_ENV="verbose")

    def spincount(code: str, **extra) -> str:
        out = subprocess.run([sys.executable, "-c", code], env={**env, **extra}, capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        return [line.split("=")[1].strip(" '") for line in out.stderr.splitlines() if "GOMP_SPINCOUNT" in line][0]

    assert spincount("import torch; torch.ones(1)") == "300000"  # torch alone: spinning
    assert spincount(code) == "0"
    assert spincount(code, OMP_WAIT_POLICY="ACTIVE") != "0"  # the user's own setting wins
    # the CLI imports the package before anything imports torch
    out = subprocess.run([sys.executable, "-c", "import sys, milegpo_cli.cli; print('torch' in sys.modules)"],
                         env=env, capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr
