"""An experiment is one experiment (issue 45, item 9): its identity does not depend on where the run
folder lives or how the recipe was named; a kill -9 during member registration leaves no MLflow run
RUNNING forever nor a second, parentless one; two commands that start one experiment at once do not
both train it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from test_experiments_ablate import TINY

from milegpo_cli.config import load_config
from milegpo_cli.experiments.ablate import experiment_name, members, spec_of
from milegpo_cli.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
SETS = [a for s in TINY for a in ("--set", s)]


def _name(recipe: str, root: str, legacy: bool = False) -> str:
    config = load_config(recipe, TINY, {"store.root": root})
    ms = members(config, [], 1)
    return experiment_name(config, spec_of(config, ms, legacy=legacy))


def test_identity_ignores_the_folder_and_the_recipe_spelling(tmp_path):
    names = {_name("webshop", "runs"), _name("webshop", str(Path("runs").resolve())),
             _name(str(ROOT / "recipes" / "webshop.toml"), str(tmp_path / "moved" / "runs"))}
    assert len(names) == 1, names
    assert _name("webshop", "runs", legacy=True) != _name("webshop", str(tmp_path), legacy=True)  # as it was


def _ablate(root: Path, *extra: str, fault: str = "", cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MILEGPO_FAULT": fault}
    return subprocess.run([sys.executable, "-m", "milegpo_cli", "ablate", "--recipe", "webshop", *SETS,
                           "--no-ablations", "--seeds", "1", "--runs-dir", str(root), *extra],
                          env=env, cwd=cwd, capture_output=True, text=True, timeout=600)


def _mlflow_runs(root: Path) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


def test_a_kill_during_registration_then_a_move_resumes_the_same_member(tmp_path):
    """kill -9 after the member's MLflow child run was created but before the store recorded it; the
    folder is then moved and the command rerun with the recipe named by its path: the same experiment
    and member, its child run linked (2 MLflow runs in all, both FINISHED)."""
    first = tmp_path / "first"
    res = _ablate(first, fault="store.commit:5:kill")  # 1 experiment, 2 its MLflow run, 4 the member's run
    assert res.returncode == -9, res.stderr[-2000:]
    with RunStore(f"sqlite:///{first / 'milegpo.db'}") as store:
        [run] = store.list_runs()
        assert run["mlflow_run_id"] is None
    assert sorted(r.info.status for r in _mlflow_runs(first)) == ["RUNNING", "RUNNING"]  # parent and child

    moved = tmp_path / "moved"
    shutil.move(first, moved)
    res = subprocess.run([sys.executable, "-m", "milegpo_cli", "ablate", "--recipe", str(ROOT / "recipes" / "webshop.toml"),
                          *SETS, "--no-ablations", "--seeds", "1", "--runs-dir", "moved"],
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "resuming experiment 1" in res.stdout
    # a log, not a terminal: one message per line (it wrapped at 80 columns), no escape codes
    assert any("at the start ->" in line and "at iteration 1" in line for line in res.stdout.splitlines()), res.stdout
    assert "\x1b" not in res.stdout
    with RunStore(f"sqlite:///{moved / 'milegpo.db'}") as store:
        assert len(store.list_experiments()) == 1
        [run] = store.list_runs()
        assert run["status"] == "finished" and run["iterations"] == 1
        parent = store.get_experiment(1)["mlflow_run_id"]
    runs = _mlflow_runs(moved)
    assert sorted(r.info.status for r in runs) == ["FINISHED", "FINISHED"], [(r.info.run_id, r.info.status) for r in runs]
    child = next(r for r in runs if r.info.run_id == run["mlflow_run_id"])
    assert child.data.tags["mlflow.parentRunId"] == parent
    assert not first.exists()  # nothing re-created in the old folder


def test_two_identical_commands_at_once_train_each_member_once(tmp_path):
    """Two identical ``sweep`` commands started together into one store: one experiment (its name is
    unique in the store), the second command refused in one line naming the first, each member trained
    once (both exited 0 with two experiments of one name, every member trained twice)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "milegpo_cli", "sweep", "--recipe", "webshop", *SETS, "--grid", "ppo.lr=1e-4,3e-4",
           "--seeds", "1", "--runs-dir", str(tmp_path)]
    RunStore(f"sqlite:///{tmp_path / 'milegpo.db'}", create=True).close()  # both open an existing store
    procs = [subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], [(c, e[-1500:]) for c, _, e in results]
    refused = next(err for code, _, err in results if code == 2)
    assert len(refused.strip().splitlines()) == 1 and "experiment 1 is being run by pid" in refused, refused
    with RunStore(f"sqlite:///{tmp_path / 'milegpo.db'}") as store:
        assert len(store.list_experiments()) == 1
        runs = store.list_runs()
        assert len(runs) == 2 and all(r["status"] == "finished" and r["iterations"] == 1 for r in runs)
        assert all(len(store.iterations(r["id"])) == 1 for r in runs)


def test_mlflow_artifacts_follow_a_moved_folder(tmp_path):
    """A run folder moved: its MLflow store's artifact locations follow it (the old folder was re-created
    by the next artifact) and the artifacts logged before the move are read from the new place."""
    from milegpo_cli.store.tracking import Tracker

    old, new = tmp_path / "old" / "runs", tmp_path / "new" / "runs"
    tracker = Tracker(f"sqlite:///{old / 'mlflow.db'}")
    first = tracker.start_run("before", params={"a": 1})
    tracker.end()
    shutil.move(tmp_path / "old", tmp_path / "new")
    tracker = Tracker(f"sqlite:///{new / 'mlflow.db'}")
    second = tracker.start_run("after", params={"a": 2})
    tracker.end()
    assert not (tmp_path / "old").exists()
    client = tracker.client
    for run_id in (first, second):
        uri = client.get_run(run_id).info.artifact_uri
        assert uri.startswith((new / "mlartifacts").as_uri()), uri
        assert [a.path for a in client.list_artifacts(run_id)] == ["config.json"]
    assert client.get_experiment(tracker.experiment_id).artifact_location == (new / "mlartifacts").resolve().as_uri()
