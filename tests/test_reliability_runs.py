"""Run folders that move, stores copied file by file, runs stopped, disks that fill (issue 35,
docs/reliability.md): the installed `milegpo` script as a subprocess on a tiny WebShop run."""
from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from test_reliability_crash import SCRIPT, milegpo, models_dir, new_root, train_args  # noqa: F401 (fixture)

SHORT = ["--set", "run.iterations=3", "--set", "checkpoint.every=1", "--set", "eval.every=3"]
TABLES = ("iterations", "evaluations", "episodes", "steps", "checkpoints", "candidates")


def counts(db: Path) -> dict[str, int]:
    con = sqlite3.connect(db)
    try:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}
    finally:
        con.close()


def rows_of_iteration(db: Path, iteration: int) -> list:
    """Ids and content of the iteration's training episodes and steps (a rewrite would change the ids)."""
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT e.id, e.task_id, s.id, s.action, s.advantage FROM episodes e JOIN steps s "
                           "ON s.episode_id = e.id WHERE e.iteration = ? AND e.evaluation_id IS NULL "
                           "ORDER BY s.id", (iteration,)).fetchall()
    finally:
        con.close()


def one_error_line(res: subprocess.CompletedProcess, *needles: str) -> str:
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture()
def killed_run(tmp_path, models_dir):  # noqa: F811
    """Run 1 killed in its second iteration: iteration 1 and its checkpoint stored."""
    root = new_root(tmp_path, "orig", models_dir)
    res = milegpo([*train_args(root), *SHORT], tmp_path, fault="ppo.step:2")
    assert res.returncode == -signal.SIGKILL, res.stdout + res.stderr
    assert counts(root / "milegpo.db")["checkpoints"] == 1
    return root


@pytest.mark.slow
def test_moved_run_folder_resumes_and_keeps_every_row(tmp_path, killed_run):
    orig = killed_run
    before, first = counts(orig / "milegpo.db"), rows_of_iteration(orig / "milegpo.db", 1)
    assert before["iterations"] == 1 and before["steps"] > 0 and first
    moved, emptied = tmp_path / "moved", tmp_path / "no_checkpoints"
    shutil.copytree(orig, moved, symlinks=True)
    shutil.copytree(orig, emptied, symlinks=True)
    shutil.rmtree(emptied / "checkpoints")

    # a copy without its checkpoints: no fallback to the original folder's files, nothing deleted
    res = milegpo(["rollout", "--run", "1", "-n", "1", "--runs-dir", str(emptied)], tmp_path)
    one_error_line(res, "no checkpoint under", str(emptied))
    res = milegpo(["train", "--resume", "1", "--runs-dir", str(emptied)], tmp_path)
    one_error_line(res, "records the checkpoint of iteration 1", "--runs-dir", "nothing was changed")
    assert counts(emptied / "milegpo.db") == before

    # the original deleted; the moved folder resumes from its own checkpoint and MLflow store
    shutil.rmtree(orig)
    res = milegpo(["train", "--resume", "1", "--runs-dir", str(moved),
                   "--mlflow-uri", f"sqlite:///{moved / 'mlflow.db'}"], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert not orig.exists()  # nothing of the old folder re-created
    after = counts(moved / "milegpo.db")
    assert after["iterations"] == 3 and after["checkpoints"] == 3
    assert rows_of_iteration(moved / "milegpo.db", 1) == first  # iteration 1 kept as it was, not replayed
    con = sqlite3.connect(moved / "milegpo.db")
    paths = [p for (p,) in con.execute("SELECT path FROM checkpoints ORDER BY iteration")]
    con.close()
    assert paths == [f"checkpoints/run_1/iter_00000{i}" for i in (1, 2, 3)]  # relative to the folder
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{moved / 'mlflow.db'}")
    [run] = client.search_runs(client.get_experiment_by_name("milegpo").experiment_id)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "success_rate")] == [1, 2, 3]
    assert run.info.status == "FINISHED"

    # moved again, by the default MLflow store of the folder (no --mlflow-uri): rollout reads it there
    again = tmp_path / "again"
    shutil.move(moved, again)
    res = milegpo(["rollout", "--run", "1", "-n", "1", "--runs-dir", str(again)], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert counts(again / "milegpo.db")["evaluations"] == after["evaluations"] + 1
    kept = counts(again / "milegpo.db")
    res = milegpo(["train", "--resume", "1", "--runs-dir", str(again)], tmp_path)  # MLflow: the folder's own
    assert res.returncode == 0, res.stdout + res.stderr
    assert counts(again / "milegpo.db") == kept and not moved.exists()


@pytest.mark.slow
def test_a_second_store_in_the_run_folder_leaves_the_first_ones_checkpoints(tmp_path, killed_run):
    root = killed_run
    ckpt = root / "checkpoints" / "run_1" / "iter_000001"
    manifest, before = (ckpt / "manifest.json").read_text(), counts(root / "milegpo.db")
    other = ["--db", f"sqlite:///{root / 'other.db'}"]

    res = milegpo([*train_args(root), *SHORT, *other], tmp_path)  # its run 1, in the same folder
    one_error_line(res, "holds the checkpoints of another run", "--runs-dir", "nothing was changed")
    assert (ckpt / "manifest.json").read_text() == manifest and counts(root / "milegpo.db") == before
    res = milegpo(["rollout", "--run", "1", "-n", "1", "--runs-dir", str(root), *other], tmp_path)
    one_error_line(res, "holds the checkpoints of another run")  # not an evaluation of the other store's policy

    res = milegpo(["train", "--resume", "1", "--runs-dir", str(root)], tmp_path)  # the folder's own store goes on
    assert res.returncode == 0, res.stdout + res.stderr
    assert counts(root / "milegpo.db")["iterations"] == 3


@pytest.mark.slow
def test_a_copied_db_file_alone_holds_every_row_and_backup(tmp_path, killed_run):
    root = killed_run
    res = milegpo(["rollout", "--run", "1", "-n", "1", "--runs-dir", str(root)], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    wal = root / "milegpo.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0  # folded into milegpo.db when the command ended
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(root / "milegpo.db", alone / "milegpo.db")  # the file only, no -wal / -shm
    assert counts(alone / "milegpo.db") == counts(root / "milegpo.db")
    assert counts(alone / "milegpo.db")["evaluations"] == 2  # warm start + this rollout

    dest = tmp_path / "backup.db"
    res = milegpo(["runs", "backup", str(dest), "--runs-dir", str(root)], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert counts(dest) == counts(root / "milegpo.db")
    assert not Path(f"{dest}-wal").exists()
    one_error_line(milegpo(["runs", "backup", str(dest), "--runs-dir", str(root)], tmp_path), "exists")
    one_error_line(milegpo(["runs", "backup", str(tmp_path / "pg.db"), "--db", "postgresql://u@127.0.0.1:1/x"],
                           tmp_path), "SQLite", "pg_dump")


@pytest.mark.slow
def test_sigterm_prints_the_resume_command_and_logs_carry_no_progress_bars(tmp_path, models_dir):  # noqa: F811
    root = new_root(tmp_path, "runs", models_dir)
    log = open(tmp_path / "train.log", "w")  # a file: no terminal
    env = {**os.environ, "COLUMNS": "160", "MILEGPO_FAULT": ""}
    # base.enabled: the policy comes from the cached base policy, the path that printed transformers' bars
    proc = subprocess.Popen([str(SCRIPT), *train_args(root), "--set", "run.iterations=200", "--set",
                             "checkpoint.every=1", "--set", "eval.every=100", "--set", "base.enabled=true",
                             "--set", "base.walkthroughs=4", "--set", "base.epochs=1"],
                            cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 240
    while not list((root / "checkpoints" / "run_1").glob("iter_*")):  # a checkpoint written, bars or not
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "train.log").read_text()
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    log.close()
    text = (tmp_path / "train.log").read_text()
    for bar in ("Writing model shards", "Loading weights", "%|"):
        assert bar not in text, text[-2000:]
    expected = f"run 1 stopped (marked killed); resume it with: milegpo train --resume 1 --runs-dir {root.resolve()}"
    assert expected in text, text[-2000:]
    assert counts(root / "milegpo.db")["iterations"] >= 1
    assert lock_of(root) == ("killed", None)
    # the printed command resumes the run: it takes the run's lock and trains (then stopped again)
    command = expected.split("resume it with: ")[1].split()
    assert command[0] == "milegpo"
    proc = subprocess.Popen([str(SCRIPT), *command[1:]], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while lock_of(root) != ("running", proc.pid) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    running = lock_of(root) == ("running", proc.pid)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert running and proc.returncode == 128 + signal.SIGTERM and "run 1 stopped" in err, err


def lock_of(root: Path) -> tuple:
    con = sqlite3.connect(root / "milegpo.db")
    try:
        return con.execute("SELECT status, lock_pid FROM runs WHERE id = 1").fetchone()
    finally:
        con.close()


def assert_full_disk_is_one_line(res: subprocess.CompletedProcess, root: Path) -> None:
    line = one_error_line(res, "checkpoint of iteration 1: no space left on the device of",
                          "the store and the earlier checkpoints are intact", "milegpo train --resume 1")
    assert "Traceback" not in res.stdout + res.stderr, line
    assert not list((root / "checkpoints" / "run_1").glob(".tmp-*"))  # the partial checkpoint is removed
    con = sqlite3.connect(root / "milegpo.db")
    assert con.execute("SELECT status FROM runs WHERE id = 1").fetchone() == ("failed",)
    assert con.execute("SELECT iteration FROM iterations").fetchall() == [(1,)]  # stored before its checkpoint
    con.close()


@pytest.mark.slow
def test_full_disk_while_writing_a_checkpoint_is_one_line(tmp_path, models_dir):  # noqa: F811
    """A real full file system: a 64 KiB tmpfs mounted on the run's checkpoint folder (root only)."""
    root = new_root(tmp_path, "runs", models_dir)
    folder = root / "checkpoints" / "run_1"
    folder.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        res = milegpo([*train_args(root), *SHORT], tmp_path)
        assert_full_disk_is_one_line(res, root)
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.mark.slow
def test_enospc_from_the_fault_hook_is_one_line(tmp_path, models_dir):  # noqa: F811
    """The same without root: ``OSError(ENOSPC)`` raised while the checkpoint is written."""
    root = new_root(tmp_path, "runs", models_dir)
    res = milegpo([*train_args(root), *SHORT], tmp_path, fault="checkpoint.write:1:enospc")
    assert_full_disk_is_one_line(res, root)
