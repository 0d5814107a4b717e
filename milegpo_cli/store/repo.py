"""The run store's repository: every read and write of runs, iterations, episodes, steps,
candidates, evaluations and checkpoints (docs/architecture.md, "What a run stores"). Opening the
database, its schema and the transactions the queries run in (retries, read-only stores, one-line
errors) are database.py's.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, aliased

from milegpo_cli.errors import RunNotFound, StoreError
from milegpo_cli.store.database import Database
from milegpo_cli.store.models import (EVALUATION_PHASES, Candidate, Checkpoint, Episode, Evaluation, Experiment,
                                      Iteration, Run, Step, TaskMemory)
from milegpo_cli.store.records import EpisodeRecord

if TYPE_CHECKING:  # the estimators' candidates, stored as they are (no import at run time: `milegpo runs` starts fast)
    from milegpo_cli.credit.result import Candidate as CreditCandidate

RUN_STATUSES = ("created", "running", "finished", "failed", "killed")
MAX_ID = 2**63 - 1  # the largest id a 64-bit INTEGER column holds; a larger one names no row


def _number(value: Any) -> Any:
    """JSON-safe scalar: numpy numbers -> Python, NaN/inf -> None."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _clean(metrics: dict[str, Any] | None) -> dict[str, Any]:
    return {str(k): _number(v) for k, v in (metrics or {}).items()}


def _summary(episodes: Sequence[EpisodeRecord]) -> dict[str, Any]:
    """Common columns of an iteration / evaluation, derived from its episodes."""
    n = len(episodes)
    steps = sum(e.length for e in episodes)
    return {
        "episodes": n,
        "success_rate": sum(bool(e.success) for e in episodes) / n if n else None,
        "mean_outcome": sum(float(e.outcome) for e in episodes) / n if n else None,
        "mean_length": steps / n if n else None,
        "invalid_rate": sum(e.invalid_count for e in episodes) / steps if steps else None,
    }


def _optional_bool(value: Any) -> bool | None:
    return None if value is None else bool(value)


def _share(value: Any) -> float | None:
    """A share in [0, 1]; None (or NaN) when it does not apply."""
    if value is None or not math.isfinite(float(value)):
        return None
    return float(value)


def _merge_versions(run: Run, versions: dict[str, str]) -> None:
    """``versions`` merged into the run's recorded versions, as a new dict: the JSON column sees the change."""
    run.versions = {**(run.versions or {}), **versions}


def _step_rows(episode_id: int, episode: EpisodeRecord) -> list[dict[str, Any]]:
    return [{
        "episode_id": episode_id, "t": int(s.t), "state_key": s.state_key, "action": s.action,
        "reward": float(s.reward), "advantage": float(s.advantage),
        "episode_advantage": float(s.episode_advantage), "step_advantage": float(s.step_advantage),
        "credit": float(s.credit), "milestone": bool(s.milestone), "trap": bool(s.trap),
        "progress": int(s.progress), "branch": int(s.branch), "unverified": bool(s.unverified),
        "oracle_good": _optional_bool(s.oracle_good), "subgoals": list(s.subgoals),
    } for s in episode.steps]


def _candidate_row(run_id: int, iteration: int, c: CreditCandidate) -> dict[str, Any]:
    """A candidate's row: an unreachable distance (inf) and a test that does not apply (NaN) are NULL."""
    finite = math.isfinite(c.distance)
    return {"run_id": run_id, "iteration": iteration, "group": c.group, "key": c.key, "kind": c.kind,
            "n_pos": int(c.n_pos), "n_neg": int(c.n_neg), "rho": float(c.rho),
            "distance": float(c.distance) if finite else None, "progress_ok": _share(c.progress_ok),
            "branch_ok": _share(c.branch_ok), "credit": float(c.credit)}


def _rows(session: Session, model: type, *where, order: Iterable = ()) -> list[dict[str, Any]]:
    stmt = select(*model.__table__.c).where(*where).order_by(*order)
    return [dict(r) for r in session.execute(stmt).mappings()]


class RunStore(Database):
    """Repository over one database URL (``sqlite:///runs/milegpo.db``, ``postgresql://...``)."""

    def _run(self, session: Session, run_id: int) -> Run:
        run = session.get(Run, run_id)
        if run is None:
            raise RunNotFound(f"run {run_id} not found in {self.display_url}")
        return run

    # --- experiments and runs ------------------------------------------------------------------
    def create_experiment(self, name: str, kind: str = "", recipe: str = "", config: dict | None = None,
                          mlflow_run_id: str | None = None) -> int:
        def fn(s: Session) -> int:
            exp = Experiment(name=name, kind=kind, recipe=recipe, config=config or {}, mlflow_run_id=mlflow_run_id)
            s.add(exp)
            s.flush()
            return exp.id
        return self._write(fn)

    def create_experiment_once(self, name: str, kind: str = "", recipe: str = "", config: dict | None = None) -> int:
        """The id of the experiment ``name``, created unless another command created it meanwhile
        (names are unique: two commands that start one experiment at once find the same row)."""
        try:
            return self.create_experiment(name, kind, recipe, config)
        except IntegrityError:
            return self.get_experiment(name)["id"]

    def set_experiment_mlflow_run_id(self, experiment_id: int, mlflow_run_id: str) -> None:
        self._write(lambda s: s.execute(update(Experiment).where(Experiment.id == experiment_id)
                                        .values(mlflow_run_id=mlflow_run_id)))

    def set_experiment_config(self, experiment_id: int, config: dict) -> None:
        self._write(lambda s: s.execute(update(Experiment).where(Experiment.id == experiment_id).values(config=config)))

    def _by_ref(self, model: type, ref: int | str, what: str) -> dict[str, Any]:
        """The row of ``model`` (Run, Experiment) by id, or by name (the newest of that name); RunNotFound."""
        def fn(s: Session) -> list[dict[str, Any]]:
            if isinstance(ref, int) or str(ref).isdecimal():
                return _rows(s, model, model.id == int(ref)) if int(ref) <= MAX_ID else []
            return _rows(s, model, model.name == ref, order=[model.id.desc()])[:1]
        rows = self._read(fn)
        if not rows:
            raise RunNotFound(f"{what} '{ref}' not found in {self.display_url}")
        return rows[0]

    def get_experiment(self, ref: int | str) -> dict[str, Any]:
        """By id, or by name (the newest experiment of that name)."""
        return self._by_ref(Experiment, ref, "experiment")

    def list_experiments(self) -> list[dict[str, Any]]:
        return self._read(lambda s: _rows(s, Experiment, order=[Experiment.id]))

    def create_run(self, name: str, algo: str, seed: int = 0, recipe: str = "", config: dict | None = None,
                   drop: Sequence[str] = (), git_commit: str | None = None, experiment_id: int | None = None,
                   versions: dict[str, str] | None = None) -> int:
        def fn(s: Session) -> int:
            run = Run(name=name, algo=algo, seed=seed, recipe=recipe, config=config or {}, drop=sorted(drop),
                      git_commit=git_commit, experiment_id=experiment_id, versions=versions or {})
            s.add(run)
            s.flush()
            return run.id
        return self._write(fn)

    def set_status(self, run_id: int, status: str, versions: dict[str, str] | None = None) -> None:
        """The run's status (and ``versions`` merged into its recorded versions, in the same transaction)."""
        if status not in RUN_STATUSES:
            raise StoreError(f"status: unknown {status!r} (allowed: {', '.join(RUN_STATUSES)})")

        def fn(s: Session) -> None:
            run = self._run(s, run_id)
            run.status = status
            if versions:
                _merge_versions(run, versions)
        self._write(fn)

    def set_provenance(self, run_id: int, git_commit: str | None, versions: dict[str, str]) -> None:
        """The code a run trains under: its git commit, and ``versions`` merged into its recorded versions."""
        def fn(s: Session) -> None:
            run = self._run(s, run_id)
            run.git_commit = git_commit
            _merge_versions(run, versions)
        self._write(fn)

    def set_mlflow_run_id(self, run_id: int, mlflow_run_id: str) -> None:
        self._write(lambda s: setattr(self._run(s, run_id), "mlflow_run_id", mlflow_run_id))

    def get_run(self, ref: int | str) -> dict[str, Any]:
        """By id, or by name (the newest run of that name); raises RunNotFound."""
        return self._by_ref(Run, ref, "run")

    def list_runs(self, experiment_id: int | None = None) -> list[dict[str, Any]]:
        """Runs in id order, each with ``iterations`` (count) and the last iteration's success rate."""
        def fn(s: Session) -> list[dict[str, Any]]:
            where = [] if experiment_id is None else [Run.experiment_id == experiment_id]
            runs = _rows(s, Run, *where, order=[Run.id])
            counts = dict(s.execute(select(Iteration.run_id, func.count()).group_by(Iteration.run_id)).all())
            last = select(Iteration.run_id, func.max(Iteration.iteration).label("it")).group_by(Iteration.run_id).subquery()
            success = dict(s.execute(select(Iteration.run_id, Iteration.success_rate).join(
                last, (Iteration.run_id == last.c.run_id) & (Iteration.iteration == last.c.it))).all())
            for run in runs:
                run["iterations"] = counts.get(run["id"], 0)
                run["last_success_rate"] = success.get(run["id"])
            return runs
        return self._read(fn)

    # --- iterations ----------------------------------------------------------------------------
    @staticmethod
    def _delete_training(s: Session, run_id: int, iteration_filter) -> None:
        """Training rows (iterations, their episodes and steps, candidates) whose iteration matches."""
        episodes = select(Episode.id).where(Episode.run_id == run_id, Episode.evaluation_id.is_(None),
                                            iteration_filter(Episode.iteration))
        s.execute(delete(Step).where(Step.episode_id.in_(episodes)))
        s.execute(delete(Episode).where(Episode.id.in_(episodes)))
        s.execute(delete(Candidate).where(Candidate.run_id == run_id, iteration_filter(Candidate.iteration)))
        s.execute(delete(Iteration).where(Iteration.run_id == run_id, iteration_filter(Iteration.iteration)))
        s.execute(delete(TaskMemory).where(TaskMemory.run_id == run_id, iteration_filter(TaskMemory.iteration)))

    @staticmethod
    def _delete_evaluations(s: Session, evaluations) -> None:
        episodes = select(Episode.id).where(Episode.evaluation_id.in_(evaluations))
        s.execute(delete(Step).where(Step.episode_id.in_(episodes)))
        s.execute(delete(Episode).where(Episode.id.in_(episodes)))
        s.execute(delete(Evaluation).where(Evaluation.id.in_(evaluations)))

    @staticmethod
    def _insert_episodes(s: Session, run_id: int, iteration: int | None, evaluation_id: int | None,
                         episodes: Sequence[EpisodeRecord]) -> None:
        if not episodes:
            return
        rows = [{"run_id": run_id, "iteration": iteration, "evaluation_id": evaluation_id, "task_id": e.task_id,
                 "split": e.split, "task_type": e.task_type, "group": e.group, "index": int(e.index),
                 "outcome": float(e.outcome), "success": bool(e.success), "length": int(e.length),
                 "invalid_count": int(e.invalid_count), "error": e.error, "final_state": e.final_state}
                for e in episodes]
        ids = s.scalars(insert(Episode).returning(Episode.id, sort_by_parameter_order=True), rows).all()
        steps = [row for eid, e in zip(ids, episodes) for row in _step_rows(eid, e)]
        if steps:
            s.execute(insert(Step), steps)

    def record_iteration(self, run_id: int, iteration: int, metrics: dict[str, Any],
                         episodes: Sequence[EpisodeRecord] = (), candidates: Sequence[CreditCandidate] = ()) -> None:
        """Write one iteration (metrics, episodes with their steps, candidates) in one transaction.
        Recording an iteration again replaces it, so a resumed run never duplicates rows."""
        def fn(s: Session) -> None:
            self._run(s, run_id)
            self._delete_training(s, run_id, lambda col: col == iteration)
            s.add(Iteration(run_id=run_id, iteration=iteration, metrics=_clean(metrics), **_summary(episodes)))
            self._insert_episodes(s, run_id, iteration, None, episodes)
            if candidates:
                s.execute(insert(Candidate), [_candidate_row(run_id, iteration, c) for c in candidates])
        self._write(fn)

    def record_task_memory(self, run_id: int, iteration: int, memories: dict[str, dict[str, Any]]) -> None:
        """The memory of the tasks that ``iteration`` played (credit/memory.py), replacing what that iteration had."""
        def fn(s: Session) -> None:
            self._run(s, run_id)
            s.execute(delete(TaskMemory).where(TaskMemory.run_id == run_id, TaskMemory.iteration == iteration))
            if memories:
                s.execute(insert(TaskMemory), [{"run_id": run_id, "iteration": iteration, "task": task, "memory": m}
                                               for task, m in memories.items()])
        self._write(fn)

    def prune_task_memory(self, run_id: int, upto: int) -> None:
        """Drop the memory rows no resume from iteration >= ``upto`` can read: a task's rows before its last row <= upto."""
        def fn(s: Session) -> None:
            last = aliased(TaskMemory)
            superseded = select(func.max(last.iteration)).where(
                last.run_id == run_id, last.task == TaskMemory.task, last.iteration <= upto).scalar_subquery()
            s.execute(delete(TaskMemory).where(TaskMemory.run_id == run_id, TaskMemory.iteration < superseded))
        self._write(fn)

    def task_memory(self, run_id: int, upto: int) -> dict[str, dict[str, Any]]:
        """Each task's memory as of iteration ``upto``: its last row at an iteration <= upto."""
        def fn(s: Session) -> dict[str, dict[str, Any]]:
            rows = s.execute(select(TaskMemory.task, TaskMemory.memory).where(
                TaskMemory.run_id == run_id, TaskMemory.iteration <= upto).order_by(TaskMemory.iteration)).all()
            return {task: memory for task, memory in rows}
        return self._read(fn)

    def delete_after(self, run_id: int, iteration: int) -> None:
        """Remove everything recorded after ``iteration`` (resume from its checkpoint)."""
        def fn(s: Session) -> None:
            self._run(s, run_id)
            self._delete_training(s, run_id, lambda col: col > iteration)
            self._delete_evaluations(s, select(Evaluation.id).where(Evaluation.run_id == run_id,
                                                                    Evaluation.iteration > iteration))
            s.execute(delete(Checkpoint).where(Checkpoint.run_id == run_id, Checkpoint.iteration > iteration))
        self._write(fn)

    def record_evaluation(self, run_id: int, split: str, metrics: dict[str, Any],
                          episodes: Sequence[EpisodeRecord] = (), iteration: int | None = None,
                          checkpoint: str | None = None, phase: str | None = None) -> int:
        """Store an evaluation and its episodes; replaces an earlier one of the same
        (run, iteration, split, checkpoint, phase). ``phase``: the policy evaluated, "untrained",
        "warmstart" (after the warm start) or "train" (after training iterations). Returns its id."""
        if phase is not None and phase not in EVALUATION_PHASES:
            raise StoreError(f"phase: unknown {phase!r} (allowed: {', '.join(EVALUATION_PHASES)})")

        def same(col, value):
            return col.is_(None) if value is None else col == value

        def fn(s: Session) -> int:
            self._run(s, run_id)
            self._delete_evaluations(s, select(Evaluation.id).where(
                Evaluation.run_id == run_id, Evaluation.split == split, same(Evaluation.iteration, iteration),
                same(Evaluation.checkpoint, checkpoint), same(Evaluation.phase, phase)))
            summary = _summary(episodes)
            ev = Evaluation(run_id=run_id, iteration=iteration, split=split, checkpoint=checkpoint, phase=phase,
                            metrics=_clean(metrics), episodes=summary["episodes"],
                            success_rate=summary["success_rate"], mean_outcome=summary["mean_outcome"])
            s.add(ev)
            s.flush()
            self._insert_episodes(s, run_id, iteration, ev.id, episodes)
            return ev.id
        return self._write(fn)

    def copy_evaluations(self, source_run: int, run_id: int, iteration: int, phase: str) -> list[dict[str, Any]]:
        """Copy ``source_run``'s evaluations of (``iteration``, ``phase``), with their episodes and steps, to
        ``run_id`` in one transaction, replacing any it holds; returns the copied rows (new ids)."""
        def fn(s: Session) -> list[dict[str, Any]]:
            self._run(s, run_id)
            where = (Evaluation.iteration == iteration, Evaluation.phase == phase, Evaluation.checkpoint.is_(None))
            self._delete_evaluations(s, select(Evaluation.id).where(Evaluation.run_id == run_id, *where))
            copied = []
            for ev in _rows(s, Evaluation, Evaluation.run_id == source_run, *where, order=[Evaluation.id]):
                new = s.scalar(insert(Evaluation).returning(Evaluation.id),
                               {**{k: v for k, v in ev.items() if k not in ("id", "created_at")}, "run_id": run_id})
                episodes = _rows(s, Episode, Episode.evaluation_id == ev["id"], order=[Episode.id])
                if episodes:  # in bulk, as _insert_episodes: one insert of the episodes, one of their steps
                    ids = s.scalars(insert(Episode).returning(Episode.id, sort_by_parameter_order=True),
                                    [{**{k: v for k, v in ep.items() if k != "id"}, "run_id": run_id,
                                      "evaluation_id": new} for ep in episodes]).all()
                    new_ids = dict(zip((ep["id"] for ep in episodes), ids))
                    steps = _rows(s, Step, Step.episode_id.in_(new_ids), order=[Step.episode_id, Step.t])
                    if steps:
                        s.execute(insert(Step), [{k: v for k, v in st.items() if k != "id"}
                                                 | {"episode_id": new_ids[st["episode_id"]]} for st in steps])
                copied.append({**ev, "id": new, "run_id": run_id})
            return copied
        return self._write(fn)

    def record_checkpoint(self, run_id: int, iteration: int, path: str | Path, sha256: str) -> None:
        def fn(s: Session) -> None:
            self._run(s, run_id)
            s.execute(delete(Checkpoint).where(Checkpoint.run_id == run_id, Checkpoint.iteration == iteration))
            s.add(Checkpoint(run_id=run_id, iteration=iteration, path=str(path), sha256=sha256))
        self._write(fn)

    # --- readers (plain dicts) -----------------------------------------------------------------
    def iterations(self, run_id: int) -> list[dict[str, Any]]:
        return self._read(lambda s: _rows(s, Iteration, Iteration.run_id == run_id, order=[Iteration.iteration]))

    def evaluations(self, run_id: int) -> list[dict[str, Any]]:
        return self._read(lambda s: _rows(s, Evaluation, Evaluation.run_id == run_id, order=[Evaluation.id]))

    def checkpoints(self, run_id: int) -> list[dict[str, Any]]:
        return self._read(lambda s: _rows(s, Checkpoint, Checkpoint.run_id == run_id, order=[Checkpoint.iteration]))

    def latest_checkpoint(self, run_id: int) -> dict[str, Any] | None:
        rows = self.checkpoints(run_id)
        return rows[-1] if rows else None

    @staticmethod
    def _episode_filter(run_id: int, iteration: int | None, evaluation_id: int | None) -> list:
        where = [Episode.run_id == run_id]
        where.append(Episode.evaluation_id.is_(None) if evaluation_id is None else Episode.evaluation_id == evaluation_id)
        if iteration is not None:
            where.append(Episode.iteration == iteration)
        return where

    def episodes(self, run_id: int, iteration: int | None = None,
                 evaluation_id: int | None = None) -> list[dict[str, Any]]:
        """Training episodes (of one iteration or all), or the episodes of one evaluation."""
        where = self._episode_filter(run_id, iteration, evaluation_id)
        return self._read(lambda s: _rows(s, Episode, *where, order=[Episode.id]))

    def steps(self, run_id: int, iteration: int | None = None,
              evaluation_id: int | None = None) -> list[dict[str, Any]]:
        """Steps of the matching episodes, ordered by episode then t."""
        episodes = select(Episode.id).where(*self._episode_filter(run_id, iteration, evaluation_id))
        return self._read(lambda s: _rows(s, Step, Step.episode_id.in_(episodes), order=[Step.episode_id, Step.t]))

    def candidates(self, run_id: int, iteration: int | None = None) -> list[dict[str, Any]]:
        where = [Candidate.run_id == run_id] + ([] if iteration is None else [Candidate.iteration == iteration])
        return self._read(lambda s: _rows(s, Candidate, *where, order=[Candidate.iteration, Candidate.id]))
