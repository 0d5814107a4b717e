"""SQLAlchemy 2 ORM schema of the run store (docs/architecture.md, "What a run stores").

Bump :data:`SCHEMA_VERSION` with every change to these tables and add the step that upgrades the
previous version in place to migrations.py; a store written by a newer version is refused with a
clear error (database.py).
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Index, Integer, SmallInteger, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

SCHEMA_VERSION = 6
EVALUATION_PHASES = ("untrained", "warmstart", "train")


def _now() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class SchemaVersion(Base):
    __tablename__ = "schema_version"
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class Experiment(Base):
    """A group of runs (an ablation over seeds, a comparison); one MLflow parent run."""

    __tablename__ = "experiments"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)  # its identity (experiments/ablate.py)
    kind: Mapped[str] = mapped_column(String(40), default="")  # "ablate", ...
    recipe: Mapped[str] = mapped_column(String(500), default="")
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    lock_host: Mapped[str | None] = mapped_column(String(255))  # the command running it (store/locks.py)
    lock_pid: Mapped[int | None] = mapped_column(Integer)
    lock_heartbeat: Mapped[float | None] = mapped_column(Float)


class Run(Base):
    __tablename__ = "runs"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    recipe: Mapped[str] = mapped_column(String(500), default="")
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)  # the resolved config
    git_commit: Mapped[str | None] = mapped_column(String(64))
    seed: Mapped[int] = mapped_column(default=0)
    algo: Mapped[str] = mapped_column(String(40))
    drop: Mapped[list[Any]] = mapped_column(default=list)  # ablated components
    status: Mapped[str] = mapped_column(String(20), default="created")
    experiment_id: Mapped[int | None] = mapped_column(ForeignKey("experiments.id"), index=True)
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))
    versions: Mapped[dict[str, Any]] = mapped_column(default=dict)  # engine / library versions
    lock_host: Mapped[str | None] = mapped_column(String(255))  # the trainer holding the run (store/locks.py)
    lock_pid: Mapped[int | None] = mapped_column(Integer)
    lock_heartbeat: Mapped[float | None] = mapped_column(Float)  # unix time of its last heartbeat
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now, onupdate=_now)


class Iteration(Base):
    __tablename__ = "iterations"
    __table_args__ = (UniqueConstraint("run_id", "iteration"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    iteration: Mapped[int]
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    episodes: Mapped[int] = mapped_column(default=0)  # common columns, derived from the episodes
    success_rate: Mapped[float | None] = mapped_column(Float)
    mean_outcome: Mapped[float | None] = mapped_column(Float)
    mean_length: Mapped[float | None] = mapped_column(Float)
    invalid_rate: Mapped[float | None] = mapped_column(Float)  # invalid actions per step
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class Evaluation(Base):
    __tablename__ = "evaluations"
    __table_args__ = {"sqlite_autoincrement": True}  # ids of replaced evaluations are never reused
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    iteration: Mapped[int | None]  # training iteration of the evaluated policy
    split: Mapped[str] = mapped_column(String(40))
    checkpoint: Mapped[str | None] = mapped_column(String(1000))
    phase: Mapped[str | None] = mapped_column(String(20))  # one of EVALUATION_PHASES; None: not given
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    episodes: Mapped[int] = mapped_column(default=0)
    success_rate: Mapped[float | None] = mapped_column(Float)
    mean_outcome: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class Episode(Base):
    """A training rollout (iteration set) or an evaluation rollout (evaluation_id set)."""

    __tablename__ = "episodes"
    __table_args__ = (Index("ix_episodes_run_iteration", "run_id", "iteration"), {"sqlite_autoincrement": True})
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    iteration: Mapped[int | None]
    evaluation_id: Mapped[int | None] = mapped_column(ForeignKey("evaluations.id"), index=True)
    task_id: Mapped[str] = mapped_column(String(300))
    split: Mapped[str] = mapped_column(String(40))
    task_type: Mapped[str] = mapped_column(String(100))
    group: Mapped[str] = mapped_column(String(300))
    index: Mapped[int]
    outcome: Mapped[float] = mapped_column(Float)
    success: Mapped[bool] = mapped_column(Boolean)
    length: Mapped[int]
    invalid_count: Mapped[int] = mapped_column(default=0)
    error: Mapped[str | None] = mapped_column(Text)
    final_state: Mapped[str | None] = mapped_column(Text)  # kappa of the state after the last step (v3)


class Step(Base):
    __tablename__ = "steps"
    __table_args__ = (Index("ix_steps_episode_t", "episode_id", "t"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    episode_id: Mapped[int] = mapped_column(ForeignKey("episodes.id"))
    t: Mapped[int]
    state_key: Mapped[str] = mapped_column(Text)
    action: Mapped[str] = mapped_column(Text)
    reward: Mapped[float] = mapped_column(Float)
    advantage: Mapped[float] = mapped_column(Float)
    episode_advantage: Mapped[float] = mapped_column(Float)
    step_advantage: Mapped[float] = mapped_column(Float)
    credit: Mapped[float] = mapped_column(Float)
    milestone: Mapped[bool] = mapped_column(Boolean)
    trap: Mapped[bool] = mapped_column(Boolean)
    progress: Mapped[int] = mapped_column(SmallInteger)
    branch: Mapped[int] = mapped_column(SmallInteger)
    unverified: Mapped[bool] = mapped_column(Boolean)
    oracle_good: Mapped[bool | None] = mapped_column(Boolean)
    subgoals: Mapped[list[Any]] = mapped_column(default=list)


class Candidate(Base):
    """A milestone or trap candidate of one group in one iteration."""

    __tablename__ = "candidates"
    __table_args__ = (Index("ix_candidates_run_iteration", "run_id", "iteration"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    iteration: Mapped[int]
    group: Mapped[str] = mapped_column(String(300))
    key: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(20))
    n_pos: Mapped[int]
    n_neg: Mapped[int]
    rho: Mapped[float] = mapped_column(Float)
    distance: Mapped[float | None] = mapped_column(Float)  # None: SUCCESS unreachable
    progress_ok: Mapped[float | None] = mapped_column(Float)  # share of credited entries passing the gate
    branch_ok: Mapped[float | None] = mapped_column(Float)
    credit: Mapped[float] = mapped_column(Float)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("run_id", "iteration"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    iteration: Mapped[int]
    path: Mapped[str] = mapped_column(String(1000))
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class TaskMemory(Base):
    """MileGPO v3's memory of one task as of one iteration (credit/memory.py, ``TaskMemory.to_dict``); written
    for the tasks an iteration played, so the memory as of iteration k is each task's last row <= k."""

    __tablename__ = "task_memory"
    __table_args__ = (Index("ix_task_memory_run_iteration", "run_id", "iteration"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    iteration: Mapped[int]
    task: Mapped[str] = mapped_column(String(300))
    memory: Mapped[dict[str, Any]] = mapped_column(default=dict)
