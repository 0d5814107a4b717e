"""``milegpo runs backup DEST``: a consistent copy of a SQLite run store (SQLite's online backup API).

The copy is taken page by page inside SQLite, so it is consistent even while trainers write to the
store, and it holds what the write-ahead log holds too; it is written to a temporary file beside DEST
and renamed into place, so DEST is either absent or complete.

``--results-only`` (:func:`keep_results`) strips the copy to what reports read: the experiments and their
finished runs with configs, iterations and evaluations (with the evaluation episodes). A grid of 50 runs
fits in a few MB, small enough to commit or carry to another machine, where rerunning the same
``ablate`` / ``sweep`` command skips the finished members and trains the rest (docs/reliability.md).
"""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from milegpo_cli.errors import StoreError

SIDE_FILES = ("-journal", "-wal", "-shm")  # files SQLite keeps beside a database, read as part of it


def sqlite_path(url: str) -> Path:
    """The file of a SQLite store URL (a bare path is one); StoreError for any other store."""
    text = str(url)
    if "://" not in text:
        return Path(text)
    try:
        parsed = make_url(text)
    except ArgumentError as err:
        raise StoreError(f"store URL {text!r} is not valid ({err})") from None
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        raise StoreError(f"runs backup copies a SQLite store; {parsed.render_as_string(hide_password=True)} is "
                         f"not one (for PostgreSQL use pg_dump)")
    return Path(parsed.database)


def backup_sqlite(url: str, dest: str | Path, results_only: bool = False) -> int:
    """Copy the store at ``url`` to the new file ``dest`` (``results_only``: stripped by :func:`keep_results`);
    returns the number of pages of the copy."""
    src_path, dest = sqlite_path(url), Path(dest)
    if not src_path.is_file():
        raise StoreError(f"no store at {src_path}")
    if dest.exists():
        raise StoreError(f"{dest} exists: give a new file")
    own = {src_path.resolve().with_name(src_path.name + s) for s in SIDE_FILES}
    if dest.parent.is_dir() and dest.parent.resolve() / dest.name in own:
        raise StoreError(f"{dest} is a file SQLite keeps beside the store {src_path} (its journal, write-ahead log "
                         "or shared memory): a copy there would break the store; give another name")
    if not dest.parent.is_dir():
        raise StoreError(f"{dest.parent} is not a folder")
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    src = sqlite3.connect(f"{src_path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        out = sqlite3.connect(tmp)
        try:
            src.backup(out)
            if results_only:
                keep_results(out)
            pages = out.execute("PRAGMA page_count").fetchone()[0]
            out.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
        finally:
            out.close()
        os.replace(tmp, dest)
    except (sqlite3.Error, OSError) as err:
        tmp.unlink(missing_ok=True)
        raise StoreError(f"runs backup of {src_path} to {dest} failed: {err}") from None
    finally:
        src.close()
    return pages


UNFINISHED = "SELECT id FROM runs WHERE status != 'finished'"


def keep_results(db: sqlite3.Connection) -> None:
    """Strip a copied store to what reports read: delete runs not finished (a resume needs their checkpoint
    files, which do not travel), training episodes, steps, milestone candidates, task memory and checkpoints,
    and each evaluation episode's final state; clear MLflow ids and locks (the MLflow store and the
    processes do not travel either). Experiments, finished runs, iterations and evaluations stay whole."""
    with db:
        for table in ("steps", "candidates", "task_memory", "checkpoints"):
            db.execute(f"DELETE FROM {table}")
        db.execute(f"DELETE FROM episodes WHERE evaluation_id IS NULL OR run_id IN ({UNFINISHED})")
        db.execute("UPDATE episodes SET final_state = NULL")
        for table in ("evaluations", "iterations"):
            db.execute(f"DELETE FROM {table} WHERE run_id IN ({UNFINISHED})")
        db.execute(f"DELETE FROM runs WHERE id IN ({UNFINISHED})")
        for table in ("runs", "experiments"):
            db.execute(f"UPDATE {table} SET mlflow_run_id = NULL, lock_host = NULL, lock_pid = NULL, "
                       "lock_heartbeat = NULL")
    db.execute("VACUUM")
