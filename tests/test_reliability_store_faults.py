"""Store and folder faults that ended in tracebacks or left runs ``running`` (issue 45, item 10): a
full disk under the store, a checkpoint folder that cannot be written, ``runs backup`` onto the
store's own journal names. Each is one line, the run marked failed and resumable. A real tmpfs and
``chattr +i`` (root only; skipped where they are not allowed)."""
from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from test_reliability_crash import milegpo, models_dir, new_root, train_args  # noqa: F401 (fixture)
from test_reliability_runs import one_error_line

SHORT = ["--set", "run.iterations=3", "--set", "checkpoint.every=1", "--set", "eval.every=3"]


def status(db: Path) -> tuple:
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT status, (SELECT count(*) FROM iterations) FROM runs WHERE id = 1").fetchone()
    finally:
        con.close()


def _root_tool(*cmd: str) -> None:
    res = subprocess.run(list(cmd), capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"{' '.join(cmd)} is not allowed here: {res.stderr.strip()}")


@pytest.mark.slow
def test_a_full_disk_under_the_store_is_one_line_and_resumable(tmp_path, models_dir):  # noqa: F811
    """The store on a 400 KiB tmpfs fills during the run (it was 189 lines of 6 chained tracebacks and
    the run left running with its lock); made larger, the run resumes and finishes."""
    root = new_root(tmp_path, "runs", models_dir)
    disk = tmp_path / "disk"
    disk.mkdir()
    _root_tool("mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(disk))
    try:
        db = ["--db", f"sqlite:///{disk / 'milegpo.db'}"]
        res = milegpo([*train_args(root), *db, "--set", "run.iterations=40"], tmp_path)
        line = one_error_line(res, f"store sqlite:///{disk / 'milegpo.db'} cannot be written (database or disk is full)",
                              "what it committed is kept")
        assert "Traceback" not in res.stdout + res.stderr, line
        assert status(disk / "milegpo.db")[0] == "failed"
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        res = milegpo(["train", "--resume", "1", "--runs-dir", str(root), *db], tmp_path)
        assert res.returncode == 0, res.stderr[-2000:]
        assert status(disk / "milegpo.db") == ("finished", 40)
    finally:
        subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.slow
def test_a_checkpoint_folder_that_cannot_be_written_is_one_line(tmp_path, models_dir):  # noqa: F811
    """An immutable checkpoint folder (a PermissionError traceback before): one line, the run failed;
    made writable, it resumes."""
    root = new_root(tmp_path, "runs", models_dir)
    folder = root / "checkpoints" / "run_1"
    folder.mkdir(parents=True)
    _root_tool("chattr", "+i", str(folder))
    try:
        res = milegpo([*train_args(root), *SHORT], tmp_path)
        one_error_line(res, f"checkpoint folder {folder} cannot be written (Operation not permitted)",
                       "make it writable, then resume")
        assert status(root / "milegpo.db")[0] == "failed"
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    res = milegpo(["train", "--resume", "1", "--runs-dir", str(root)], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert status(root / "milegpo.db") == ("finished", 3)


@pytest.mark.parametrize("side", ["-journal", "-wal", "-shm"])
def test_backup_onto_the_stores_own_side_files_is_refused(tmp_path, side):
    from milegpo_cli.store import RunStore

    db = tmp_path / "milegpo.db"
    with RunStore(f"sqlite:///{db}", create=True) as store:
        store.create_run(name="r", algo="grpo")
    res = milegpo(["runs", "backup", f"milegpo.db{side}", "--runs-dir", "."], tmp_path)
    one_error_line(res, f"milegpo.db{side} is a file SQLite keeps beside the store")
    assert not (tmp_path / f"milegpo.db{side}").exists()
    with RunStore(f"sqlite:///{db}") as store:
        assert [r["name"] for r in store.list_runs()] == ["r"]


def test_quick_check_names_a_store_damaged_under_the_command(tmp_path):
    """What ``train`` runs when its run ends: a store truncated under the command is one line now (only
    the next command noticed before), an intact store passes."""
    from milegpo_cli.errors import StoreError
    from milegpo_cli.store import RunStore

    db = tmp_path / "milegpo.db"
    with RunStore(f"sqlite:///{db}", create=True) as store:
        for i in range(300):
            store.create_run(name=f"run-{i}-" + "x" * 200, algo="grpo")
        store.quick_check()
    store = RunStore(f"sqlite:///{db}")  # a command's store, open and intact
    try:
        os.truncate(db, db.stat().st_size // 2)  # truncated under the command (a stray copy, a full disk)
        with pytest.raises(StoreError, match=r"is damaged"):
            store.quick_check()
    finally:
        store.engine.dispose()
