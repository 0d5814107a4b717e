"""Experiments and engines on a real two-node Ray cluster on this machine (ray.cluster_utils.Cluster):
a head and a second node carrying the custom resource ``env_host``."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from milegpo_cli.store import RunStore  # noqa: E402
from milegpo_cli.trainer.checkpoint import list_checkpoints  # noqa: E402
from test_experiments_ablate import TINY  # noqa: E402  (tests/ is on sys.path: rootdir-relative imports)

OBJECT_STORE = 80 * 2**20
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"  # Ray 2.60 turns token authentication on by default
    # started with SIGINT ignored, as by a background job (`ray start ... &`, nohup, CI): its workers inherit
    # that, and ray.cancel cannot interrupt a task there unless the task handles SIGINT itself
    sigint = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": OBJECT_STORE,
                                                          "include_dashboard": False})
        c.add_node(num_cpus=1, resources={"env_host": 2}, object_store_memory=OBJECT_STORE)
    finally:
        signal.signal(signal.SIGINT, sigint)
    c.wait_for_nodes()
    yield c
    if ray.is_initialized():
        ray.shutdown()
    c.shutdown()
    if saved is None:
        os.environ.pop("RAY_AUTH_MODE", None)
    else:
        os.environ["RAY_AUTH_MODE"] = saved


def _cli(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    return subprocess.Popen([sys.executable, "-m", "milegpo_cli", *args], env=env, cwd=ROOT, text=True, **kw)


def _running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_cli_does_not_import_ray():
    code = ("import sys, milegpo_cli.cli, milegpo_cli.experiments.ablate, milegpo_cli.experiments.sweep, "
            "envs.alfworld.engine; print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code],
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_unseen_names_the_folder_and_node():
    from milegpo_cli.experiments.ray_dispatch import shared_paths, unseen

    paths = shared_paths("sqlite:////shared/runs/milegpo.db", "http://mlflow:5000", "/shared/runs")
    assert paths == {"--runs-dir": Path("/shared/runs"), "--db (a SQLite store)": Path("/shared/runs")}
    assert unseen(paths, {"a" * 56: ("10.0.0.1", {"/shared/runs"})}) == []
    assert unseen(paths, {"a" * 56: ("10.0.0.1", {"/shared/runs"}), "b" * 56: ("10.0.0.2", set())}) == [
        "--runs-dir /shared/runs is not seen by node 10.0.0.2 (bbbbbbbbbbbb)",
        "--db (a SQLite store) /shared/runs is not seen by node 10.0.0.2 (bbbbbbbbbbbb)"]
    # two nodes on one ip (containers, several raylets on one host): each answer counts
    assert unseen(paths, {"a" * 56: ("10.0.0.1", set()), "b" * 56: ("10.0.0.1", {"/shared/runs"})}) == [
        "--runs-dir /shared/runs is not seen by node 10.0.0.1 (aaaaaaaaaaaa)",
        "--db (a SQLite store) /shared/runs is not seen by node 10.0.0.1 (aaaaaaaaaaaa)"]
    assert shared_paths("postgresql+psycopg://u@db/milegpo", "file:///shared/mlruns", "/shared/runs")[
        "--mlflow-uri (a file store)"] == Path("/shared/mlruns")


@pytest.mark.slow
def test_ablate_on_cluster_lands_each_member_once_and_resumes_a_killed_one(cluster, postgres_url, tmp_path):
    """2 members x 2 seeds into PostgreSQL; one member's task worker is killed after its first
    iteration: it resumes from that checkpoint in the same run, and no member is trained twice."""
    sets = [a for s in TINY if not s.startswith("run.iterations") for a in ("--set", s)]
    log = open(tmp_path / "ablate.out", "w")
    proc = _cli("ablate", "--recipe", "webshop", *sets, "--set", "run.iterations=3", "--drop", "reliability",
                "--seeds", "2", "--ray", cluster.address, "--db", postgres_url, "--runs-dir", str(tmp_path),
                "--mlflow-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", stdout=log, stderr=subprocess.STDOUT)
    store = RunStore(postgres_url)
    killed = None
    deadline = time.time() + 400
    while proc.poll() is None and time.time() < deadline:
        if killed is None:
            for r in store.list_runs():
                logf = tmp_path / "logs" / f"run{r['id']}.log"
                if r["status"] == "running" and logf.exists() and list_checkpoints(tmp_path / "checkpoints" / f"run_{r['id']}"):
                    pids = re.findall(r"task worker pid (\d+), train pid (\d+)", logf.read_text(errors="replace"))
                    if pids:
                        os.kill(int(pids[-1][0]), signal.SIGKILL)  # the Ray worker: its train child dies with it
                        killed, orphan = r["id"], int(pids[-1][1])
                        break
        time.sleep(0.5)
    if proc.poll() is None:
        proc.kill()
    log.close()
    out = " ".join((tmp_path / "ablate.out").read_text().split())  # rich wraps long lines
    assert proc.returncode == 0, out[-3000:]
    assert killed is not None, "no member was caught mid-run"
    assert not _running(orphan)  # the killed attempt's train process died with its worker

    exp = store.get_experiment(1)  # the only experiment of a fresh database
    runs = store.list_runs(exp["id"])
    assert sorted((tuple(r["drop"]), r["seed"]) for r in runs) == [((), 0), ((), 1), (("reliability",), 0),
                                                                  (("reliability",), 1)]
    assert len(store.list_runs()) == 4  # nothing outside the experiment either
    assert all(r["status"] == "finished" and r["iterations"] == 3 for r in runs)
    assert [it["iteration"] for it in store.iterations(killed)] == [1, 2, 3]  # resumed, not restarted
    member_log = (tmp_path / "logs" / f"run{killed}.log").read_text(errors="replace")
    assert "[ray] attempt 2" in member_log and "[ray] attempt 3" not in member_log
    assert "iteration 0" in member_log.split("[ray] attempt 2")[0]  # the first attempt evaluated the start...
    assert "iteration 0" not in member_log.split("[ray] attempt 2")[1]  # ...the second resumed a checkpoint
    assert f"(run {killed}) died (WorkerCrashedError); resuming it from its last checkpoint" in out
    assert f"(run {killed}, attempt 2)" in out

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    children = [client.get_run(r["mlflow_run_id"]) for r in runs]
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {exp["mlflow_run_id"]}
    assert len(client.search_runs([children[0].info.experiment_id])) == 5  # the parent and its 4 members

    rep = _cli("report", "--experiment", str(exp["id"]), "--json", "--db", postgres_url, "--runs-dir", str(tmp_path),
               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = rep.communicate(timeout=300)
    assert rep.returncode == 0, stderr
    assert set(json.loads(stdout)["methods"]) == {"milegpo", "milegpo -reliability"}


def test_remote_store_check_accepts_folders_every_node_sees(cluster, tmp_path):
    from milegpo_cli.experiments import ray_dispatch

    ray_dispatch.connect(cluster.address)
    try:
        ray_dispatch.check_shared(cluster.address, f"sqlite:///{tmp_path / 'db' / 'm.db'}",
                                  f"file://{tmp_path / 'mlruns'}", tmp_path / "runs")
        assert not list(tmp_path.rglob(".milegpo-ray-check-*"))  # markers removed
    finally:
        ray_dispatch.disconnect()


def test_engine_actors_play_the_process_workers_episodes_on_the_resource_node(cluster, alfworld_config):
    """workers_backend "ray": two actors (two slots each) on the node carrying env_host, stepped in two
    pipelined lanes, give exactly the episodes of two worker processes."""
    from envs.alfworld.engine import AlfworldVectorEnv
    from envs.registry import make_suite
    from milegpo_cli.experiments import ray_dispatch
    from test_alfworld_engine import _random_walk

    tasks = sorted(make_suite("alfworld", alfworld=alfworld_config).tasks("train", 2), key=lambda t: t.task_id)
    ray_dispatch.connect(cluster.address)
    actors = AlfworldVectorEnv(4, workers=2, backend="ray", ray_resource="env_host", ray_cpus=0.25)
    procs = AlfworldVectorEnv(4, workers=2)
    try:
        assert _random_walk(actors, tasks, lanes=2) == _random_walk(procs, tasks, lanes=2)
        resource_node = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "env_host" in n["Resources"])
        assert [ray.get(p.actor.node_id.remote()) for p in actors._procs] == [resource_node] * 2
    finally:
        actors.close()
        procs.close()
        ray_dispatch.disconnect()


@pytest.mark.slow
def test_sweep_on_cluster_reports_its_variants(cluster, tmp_path):
    """A sweep through the CLI on the cluster, its SQLite store and runs folder checked as seen by both
    nodes; report --json ranks the variants."""
    sets = [a for s in TINY for a in ("--set", s)]
    run = _cli("sweep", "--recipe", "webshop", *sets, "--grid", "ppo.lr=1e-4,3e-4", "--seeds", "2",
               "--ray", cluster.address, "--runs-dir", str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = run.communicate(timeout=600)[0]
    assert run.returncode == 0, out[-3000:]
    store = RunStore(f"sqlite:///{tmp_path / 'milegpo.db'}")
    exp = store.get_experiment(1)
    assert exp["kind"] == "sweep" and len(store.list_runs(exp["id"])) == 4
    rep = _cli("report", "--experiment", str(exp["id"]), "--json", "--runs-dir", str(tmp_path),
               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    doc = json.loads(rep.communicate(timeout=300)[0])
    assert set(doc["variants"]["variants"]) == {"milegpo ppo.lr=0.0001", "milegpo ppo.lr=0.0003"}


def test_ray_usage_errors_are_one_line():
    for args, msg in [(["--parallel", "2", "--ray", "local"], "--parallel and --ray exclude each other"),
                      (["--ray-gpus", "1"], "--ray-gpus needs --ray")]:
        p = _cli("ablate", "--recipe", "webshop", *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = p.communicate(timeout=120)
        assert p.returncode == 2 and len(err.strip().splitlines()) == 1 and err.startswith(f"error: {msg}"), err


@pytest.mark.slow
def test_a_ray_member_killed_after_the_stop_grace_is_marked_killed(cluster, tmp_path):
    """MILEGPO_STOP_GRACE=0: each member's ``train`` is SIGKILLed at once after its SIGTERM, before it
    can mark its run; the driver marks them killed in the store and MLflow and releases their locks
    (they stayed running, their locks held, before)."""
    from test_reliability_drivers import LONG, _cli as _cli_env, _stop_and_check

    proc = _cli_env("ablate", "--recipe", "webshop", *LONG, "--no-ablations", "--seeds", "2", "--ray", cluster.address,
                    "--runs-dir", str(tmp_path), env={"MILEGPO_STOP_GRACE": "0"}, stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT)
    out = _stop_and_check(proc, signal.SIGTERM, tmp_path, 2)
    assert out.count("killed after 0 s, marked killed") == 2, out[-3000:]


@pytest.mark.slow
def test_sigterm_to_a_ray_driver_stops_every_member_at_once(cluster, tmp_path):
    """Two members train on the two nodes; SIGTERM to the driver: within 30 s every member is killed in
    the store and MLflow, one line, exit 143 (they trained on for ~60 s and stayed running before)."""
    from test_reliability_drivers import LONG, _stop_and_check

    proc = _cli("ablate", "--recipe", "webshop", *LONG, "--no-ablations", "--seeds", "2", "--ray", cluster.address,
                "--runs-dir", str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = _stop_and_check(proc, signal.SIGTERM, tmp_path, 2)
    assert "stopped milegpo s0" in out and "stopped milegpo s1" in out


def test_members_that_no_node_has_room_for_are_refused_before_registering(cluster, tmp_path):
    """run.threads = 2 on 1-CPU nodes: one line, and no experiment or member run left in the store (4
    member runs were left `created`)."""
    sets = [a for s in TINY if not s.startswith("run.threads") for a in ("--set", s)]
    p = _cli("ablate", "--recipe", "webshop", *sets, "--set", "run.threads=2", "--seeds", "2", "--drop", "reliability",
             "--ray", cluster.address, "--runs-dir", str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: --ray: no node has room for a member (2 CPUs = run.threads"), err
    store = RunStore(f"sqlite:///{tmp_path / 'milegpo.db'}")
    assert store.list_runs() == [] and store.list_experiments() == []


def test_a_member_on_a_node_without_its_folder_is_not_retried(cluster, tmp_path):
    """The task finds no working folder on its node: it says so instead of raising, so that the driver
    does not resubmit a member whose every attempt must fail."""
    from milegpo_cli.experiments import ray_dispatch

    ray_dispatch.connect(cluster.address)
    try:
        task = ray.remote(ray_dispatch._member).options(num_cpus=0)
        answer = ray.get(task.remote(["-c", "pass"], {}, str(tmp_path / "not-here"), "logs/run1.log", 1, 60.0),
                         timeout=120)
        assert answer.startswith(f"folder {tmp_path / 'not-here'} is not seen by node "), answer
    finally:
        ray_dispatch.disconnect()


def test_a_cancelled_member_stops_its_train_at_once_on_a_cluster_that_ignores_sigint(cluster, tmp_path):
    """ray.cancel (a stopped driver) reaches a member's task on workers that inherited an ignored SIGINT:
    its ``train`` gets SIGTERM within seconds (the cancel was lost, and the member ran on for 70 s until
    force-cancelled)."""
    from milegpo_cli.experiments import ray_dispatch

    (tmp_path / "logs").mkdir()
    ray_dispatch.connect(cluster.address)
    try:
        task = ray.remote(ray_dispatch._member).options(num_cpus=1, max_retries=0)
        trap = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(7)); time.sleep(600)"
        ref = task.remote(["-c", trap], {}, str(tmp_path), "logs/run1.log", 1, 60.0)
        log = tmp_path / "logs" / "run1.log"
        deadline = time.monotonic() + 120
        while "train pid" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(1.0)  # the child is in its sleep
        sent = time.monotonic()
        ray.cancel(ref)
        with pytest.raises(ray.exceptions.TaskCancelledError):
            ray.get(ref, timeout=30)
        assert time.monotonic() - sent < 10
        child = int(re.search(r"train pid (\d+)", log.read_text()).group(1))
        assert not _running(child)
    finally:
        ray_dispatch.disconnect()


def test_engine_actors_that_cannot_be_placed_are_one_line(cluster):
    """Two actors of 1 CPU on the one 1-CPU node carrying env_host: refused within the placement timeout
    naming what does not fit where (a 120 s EngineTimeout traceback after nearly 5 minutes before)."""
    from envs.alfworld.engine import AlfworldVectorEnv
    from envs.alfworld.ray_workers import PLACE_TIMEOUT_S
    from envs.base import EnvError
    from milegpo_cli.experiments import ray_dispatch

    ray_dispatch.connect(cluster.address)
    try:
        start = time.monotonic()
        with pytest.raises(EnvError, match=r"2 engine actors of 1 CPUs \(env.alfworld.ray_worker_cpus\) do not fit on "
                                           r"the 1 node\(s\) with 'env_host' \(1 CPUs in all"):
            AlfworldVectorEnv(4, workers=2, backend="ray", ray_resource="env_host", ray_cpus=1.0)
        assert time.monotonic() - start < PLACE_TIMEOUT_S + 15
        ok = AlfworldVectorEnv(4, workers=2, backend="ray", ray_resource="env_host", ray_cpus=0.25)  # the room is free
        ok.close()
    finally:
        ray_dispatch.disconnect()


RAYLET_LINE_DRIVER = """
import os, sys, time
import ray
from milegpo_cli.experiments import ray_dispatch

class Seen:  # this driver's stdout, noting what Ray printed on it
    def __init__(self, out):
        self.out, self.text = out, ""
    def write(self, text):
        self.text += text
        return self.out.write(text)
    def __getattr__(self, name):
        return getattr(self.out, name)

sys.stdout = Seen(sys.stdout)
ray_dispatch.connect(sys.argv[1])
talk = ray.remote(num_cpus=0)(lambda: print("a worker prints", flush=True))
die = ray.remote(num_cpus=0, max_retries=0)(lambda: os._exit(1))
ray.get(talk.remote())
try:
    ray.get(die.remote())
except ray.exceptions.WorkerCrashedError:
    pass
deadline = time.monotonic() + 60
while "(raylet)" not in sys.stdout.text and time.monotonic() < deadline:
    time.sleep(0.2)
ray_dispatch.disconnect()
"""


def test_ray_lines_in_a_drivers_log_carry_no_escape_codes(cluster):
    """A driver whose stdout is no terminal: a task that prints and one whose worker dies; Ray's own
    `(raylet)` line about the dead worker reaches the driver's output without colour codes (it was
    `\\x1b[33m(raylet)\\x1b[0m ...`), and the worker's print does not reach it (log_to_driver=False)."""
    proc = subprocess.run([sys.executable, "-c", RAYLET_LINE_DRIVER, cluster.address], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "(raylet) A worker died" in out, out[-3000:]
    assert "\x1b[" not in out and "a worker prints" not in out, out[-3000:]
