"""In-place upgrades of an older run store, run by ``RunStore`` when it opens one (docs/architecture.md).

``MIGRATIONS[v]`` turns a version-``v`` store into version ``v + 1``. Each step is plain SQL that
SQLite (3.35 or newer: ``DROP COLUMN``) and PostgreSQL both run, inside the store's open
transaction, so an upgrade either completes or leaves the store untouched; no row is lost.
"""
from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection, text


def _v1_to_v2(conn: Connection) -> None:
    """``evaluations.phase`` (iteration 0 -> "untrained", other iterations -> "train"); candidate
    ``progress_ok`` / ``branch_ok`` become shares in [0, 1] (a v1 yes/no becomes 1.0 / 0.0)."""
    conn.execute(text("ALTER TABLE evaluations ADD COLUMN phase VARCHAR(20)"))
    conn.execute(text("UPDATE evaluations SET phase = CASE WHEN iteration = 0 THEN 'untrained' ELSE 'train' END "
                      "WHERE iteration IS NOT NULL"))
    for col in ("progress_ok", "branch_ok"):
        conn.execute(text(f"ALTER TABLE candidates RENAME COLUMN {col} TO {col}_v1"))
        conn.execute(text(f"ALTER TABLE candidates ADD COLUMN {col} FLOAT"))
        conn.execute(text(f"UPDATE candidates SET {col} = CASE WHEN {col}_v1 IS NULL THEN NULL "
                          f"WHEN {col}_v1 THEN 1.0 ELSE 0.0 END"))
        conn.execute(text(f"ALTER TABLE candidates DROP COLUMN {col}_v1"))


def _v2_to_v3(conn: Connection) -> None:
    """``episodes.final_state``: the state after the last step; NULL (unknown) for the episodes already stored."""
    conn.execute(text("ALTER TABLE episodes ADD COLUMN final_state TEXT"))


def _v3_to_v4(conn: Connection) -> None:
    """``runs.lock_host`` / ``lock_pid`` / ``lock_heartbeat``: the trainer holding a run (store/locks.py)."""
    conn.execute(text("ALTER TABLE runs ADD COLUMN lock_host VARCHAR(255)"))
    conn.execute(text("ALTER TABLE runs ADD COLUMN lock_pid INTEGER"))
    conn.execute(text("ALTER TABLE runs ADD COLUMN lock_heartbeat FLOAT"))


def _v4_to_v5(conn: Connection) -> None:
    """``experiments.name`` unique (two commands started one experiment twice before): of experiments
    of one name the newest keeps it, as ``get_experiment`` found it, the others become ``NAME~ID``;
    ``experiments.lock_*``: the command running an experiment (store/locks.py)."""
    conn.execute(text("UPDATE experiments SET name = name || '~' || CAST(id AS VARCHAR(20)) WHERE id < "
                      "(SELECT MAX(e.id) FROM experiments e WHERE e.name = experiments.name)"))
    conn.execute(text("CREATE UNIQUE INDEX ix_experiments_name ON experiments (name)"))
    conn.execute(text("ALTER TABLE experiments ADD COLUMN lock_host VARCHAR(255)"))
    conn.execute(text("ALTER TABLE experiments ADD COLUMN lock_pid INTEGER"))
    conn.execute(text("ALTER TABLE experiments ADD COLUMN lock_heartbeat FLOAT"))


def _v5_to_v6(conn: Connection) -> None:
    """``task_memory``: MileGPO v3's memory across iterations of a task (credit/memory.py); a new, empty table,
    created from its model (SQLAlchemy writes each dialect's CREATE TABLE and index)."""
    from .models import TaskMemory
    TaskMemory.__table__.create(conn)


MIGRATIONS: dict[int, Callable[[Connection], None]] = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4, 4: _v4_to_v5,
                                                      5: _v5_to_v6}


def upgrade(conn: Connection, version: int, target: int) -> None:
    """Apply every step from ``version`` up to ``target``."""
    for v in range(version, target):
        MIGRATIONS[v](conn)
