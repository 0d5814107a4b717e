"""The run store's repository: every read and write of runs, iterations, episodes, steps,
candidates, evaluations and checkpoints (docs/architecture.md, "What a run stores").

SQLite by default, any SQLAlchemy URL otherwise. Several processes may write one SQLite file at once
(notes/stack-facts.md): WAL journal, a busy timeout, ``synchronous=NORMAL``, and writes that take the
write lock up front with ``BEGIN IMMEDIATE`` (a deferred transaction that reads then writes cannot
upgrade its lock and fails at once), plus a small retry around each write transaction.
PostgreSQL: opening takes a transaction-scoped advisory lock, so processes that open one fresh (or
older) store at once create (or upgrade) its tables one after the other. An older store is upgraded
in place on open (migrations.py).

Opening never repairs: only ``create=True`` makes a store where there is none; a store that holds
some of the tables but not all is refused as damaged (not re-created empty); a SQLite store that a
reader cannot write is opened read-only (``mode=ro``: no WAL pragma, no upgrade). Every failure to
open (corrupt or foreign file, unknown URL, unreachable server) is a one-line :class:`StoreError`.
"""
from __future__ import annotations

import math
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, delete, event, func, inspect, insert, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, NoSuchModuleError, OperationalError
from sqlalchemy.orm import Session

from envs.faults import fault_point
from milegpo_cli.errors import RunNotFound, StoreError
from milegpo_cli.interrupts import deferred_interrupts
from milegpo_cli.store.migrations import upgrade
from milegpo_cli.store.models import (EVALUATION_PHASES, SCHEMA_VERSION, Base, Candidate, Checkpoint, Episode,
                                      Evaluation, Experiment, Iteration, Run, SchemaVersion, Step)
from milegpo_cli.store.records import CandidateRecord, EpisodeRecord

RUN_STATUSES = ("created", "running", "finished", "failed", "killed")
BUSY_TIMEOUT_S = 60.0
MAX_ID = 2**63 - 1  # the largest id a 64-bit INTEGER column holds; a larger one names no row
SCHEMA_LOCK_KEY = 0x6D696C65  # PostgreSQL advisory lock taken while opening a store ("mile")
T = TypeVar("T")


def _sqlite_engine(url: str, read_only: bool = False) -> Engine:
    """A SQLite engine; ``read_only``: the file is opened with ``mode=ro`` and no pragma that writes."""
    if read_only:
        uri = _read_only_uri(Path(make_url(url).database))
        engine = create_engine("sqlite://", creator=lambda: sqlite3.connect(
            uri, uri=True, timeout=BUSY_TIMEOUT_S, check_same_thread=False))
    else:
        engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_S})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None  # the driver issues no BEGIN of its own; _on_begin does
        cur = dbapi_conn.cursor()
        if not read_only:
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("write") else "BEGIN")

    return engine


def _url(url: str | Path) -> str:
    """A SQLAlchemy URL; a bare path means a SQLite file."""
    text = str(url)
    return text if "://" in text else f"sqlite:///{text}"


def _sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL; None for another database or an in-memory one."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def _writable(path: Path) -> bool:
    """Whether this process may write a SQLite file in WAL mode: the file, its -wal / -shm files
    and its folder (where SQLite creates them)."""
    files = [path, *(p for p in (path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")) if p.exists())]
    return all(os.access(f, os.W_OK) for f in files) and os.access(path.parent, os.W_OK)


def _frozen(path: Path) -> bool:
    """A WAL store with no -shm and nothing in its -wal: no writer is at work (a connected writer keeps
    its -shm file), so a ``mode=ro`` reader opens it as immutable. Otherwise SQLite would create the
    -shm / -wal files a reader needs, or fail where the folder is not writable: reading creates nothing."""
    wal, shm = (path.with_name(path.name + suffix) for suffix in ("-wal", "-shm"))
    return not shm.exists() and (not wal.exists() or wal.stat().st_size == 0)


def _read_only_uri(path: Path) -> str:
    return f"file:{quote(os.path.abspath(path))}?mode=ro" + ("&immutable=1" if _frozen(path) else "")


def _milegpo_tables(path: Path) -> set[str]:
    """The milegpo tables of a SQLite file, read through a read-only connection: a command that does
    not create a store never writes a file that holds none (not even its journal mode)."""
    con = sqlite3.connect(_read_only_uri(path), uri=True, timeout=BUSY_TIMEOUT_S)
    try:
        names = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        con.close()
    return names & set(Base.metadata.tables)


SQLITE_DAMAGED = ("SQLITE_CORRUPT", "SQLITE_NOTADB")
SQLITE_UNUSABLE = (*SQLITE_DAMAGED, "SQLITE_CANTOPEN", "SQLITE_IOERR", "SQLITE_READONLY", "SQLITE_FULL", "SQLITE_PERM")


def unusable(err: DBAPIError) -> bool:
    """Whether a SQLite error means the file itself cannot be used (damaged, foreign, cannot be
    opened or written) rather than a fault of the statement."""
    return getattr(err.orig, "sqlite_errorname", "").startswith(SQLITE_UNUSABLE)


def connection_lost(err: DBAPIError) -> bool:
    """Whether a database server's error means the connection is gone (refused, closed, the server
    or the database shut down) rather than a fault of the statement: SQLAlchemy's disconnect test, no
    SQLSTATE (the connection failed before the server answered), or SQLSTATE class 08 (connection
    exception) or 57P (operator intervention). SQLite errors are never this."""
    if err.connection_invalidated:
        return True
    if not isinstance(err, OperationalError) or isinstance(err.orig, sqlite3.Error):
        return False
    state = getattr(err.orig, "sqlstate", None)
    return state is None or state.startswith(("08", "57P"))


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


def _step_rows(episode_id: int, episode: EpisodeRecord) -> list[dict[str, Any]]:
    return [{
        "episode_id": episode_id, "t": int(s.t), "state_key": s.state_key, "action": s.action,
        "reward": float(s.reward), "advantage": float(s.advantage),
        "episode_advantage": float(s.episode_advantage), "step_advantage": float(s.step_advantage),
        "credit": float(s.credit), "milestone": bool(s.milestone), "trap": bool(s.trap),
        "progress": int(s.progress), "branch": int(s.branch), "unverified": bool(s.unverified),
        "oracle_good": _optional_bool(s.oracle_good), "subgoals": list(s.subgoals),
    } for s in episode.steps]


def _candidate_row(run_id: int, iteration: int, c: CandidateRecord) -> dict[str, Any]:
    finite = c.distance is not None and math.isfinite(c.distance)
    return {"run_id": run_id, "iteration": iteration, "group": c.group, "key": c.key, "kind": c.kind,
            "n_pos": int(c.n_pos), "n_neg": int(c.n_neg), "rho": float(c.rho),
            "distance": float(c.distance) if finite else None, "progress_ok": _share(c.progress_ok),
            "branch_ok": _share(c.branch_ok), "credit": float(c.credit)}


def _rows(session: Session, model: type, *where, order: Iterable = ()) -> list[dict[str, Any]]:
    stmt = select(*model.__table__.c).where(*where).order_by(*order)
    return [dict(r) for r in session.execute(stmt).mappings()]


class RunStore:
    """Repository over one database URL (``sqlite:///runs/milegpo.db``, ``postgresql://...``)."""

    def __init__(self, url: str | Path, retries: int = 5, *, create: bool = True, reader: bool = False):
        """``create``: make the store when there is none (else: StoreError "no store at ...");
        ``reader``: the caller only reads, so a SQLite store it cannot write is opened read-only."""
        self.url = _url(url)
        self.retries = retries
        self.read_only = False  # a reader's store that this process cannot write: opened with mode=ro
        self.file: Path | None = None  # the SQLite file
        self.engine = self._engine(create, reader)
        self._writer = self.engine.execution_options(write=True)
        try:
            (self._read if self.read_only else self._write)(lambda s: self._init_schema(s, create))
        except BaseException as err:  # e.g. a newer schema: leave no open connection (nor -wal file) behind
            self.engine.dispose()
            if isinstance(err, DBAPIError):
                raise StoreError(self.why(err)) from None
            raise

    def _engine(self, create: bool, reader: bool) -> Engine:
        try:
            path = self.file = _sqlite_file(self.url)
            backend = make_url(self.url).get_backend_name()
        except ArgumentError as err:
            raise StoreError(f"store URL {self.url!r}: {err}") from None
        if path is not None:
            if path.is_dir():
                raise StoreError(f"{path} is a folder, not a store (--db takes a SQLite file or a database URL)")
            if not path.exists():
                if not create:
                    raise StoreError(f"no store at {path} (check --runs-dir / --db)")
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as err:
                    raise StoreError(f"cannot create the store's folder {path.parent}: {err.strerror}") from None
            else:
                self._check_existing(path, create, reader)
        try:
            if backend == "sqlite":
                return _sqlite_engine(self.url, self.read_only)
            return create_engine(self.url, pool_pre_ping=True)
        except NoSuchModuleError:
            raise StoreError(f"store URL {self.display_url}: unknown database kind {make_url(self.url).drivername!r} "
                             "(sqlite:///FILE or postgresql+psycopg://...)") from None
        except ImportError as err:
            raise StoreError(f"store URL {self.display_url}: its database driver is not installed ({err})") from None

    def _check_existing(self, path: Path, create: bool, reader: bool) -> None:
        """An existing SQLite file: a store (unless ``create``), and writable unless a reader opens it
        (then read-only)."""
        if not create:
            try:
                tables = _milegpo_tables(path)
            except sqlite3.Error as err:
                raise StoreError(self.why(err)) from None
            if not tables:
                raise StoreError(f"no store at {self.display_url} (the database holds no milegpo tables)")
        self.read_only = not _writable(path)
        if self.read_only and not reader:
            raise StoreError(f"cannot use store {self.display_url}: it is read-only here (a command that writes "
                             "needs the file and its folder writable)")

    def why(self, err: DBAPIError | sqlite3.Error) -> str:
        """One line on a store that cannot be used."""
        orig = err.orig if isinstance(err, DBAPIError) else err
        reason = " ".join(str(orig).split())
        name = getattr(orig, "sqlite_errorname", "")
        if name.startswith(SQLITE_DAMAGED):
            return f"store {self.display_url} is damaged or not a milegpo store ({reason})"
        if name.startswith(("SQLITE_FULL", "SQLITE_IOERR", "SQLITE_READONLY", "SQLITE_PERM")):
            return (f"store {self.display_url} cannot be written ({reason}); what it committed is kept: free space "
                    "or make its folder writable, then resume")
        return f"cannot use store {self.display_url}: {reason}"

    @property
    def display_url(self) -> str:
        return make_url(self.url).render_as_string(hide_password=True)

    def close(self) -> None:
        """Release the connections; a SQLite store's write-ahead log is first folded into the database
        file (``wal_checkpoint(TRUNCATE)``), so that the file alone holds every committed row."""
        if self.engine.dialect.name == "sqlite" and not self.read_only:
            try:
                with self.engine.connect() as conn:
                    conn.exec_driver_sql("PRAGMA busy_timeout=2000")  # others writing: best effort
                    conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            except OperationalError:
                pass
        self.engine.dispose()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- plumbing ----------------------------------------------------------------------------
    @deferred_interrupts()
    def _write(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn`` in one write transaction, retried when the database stays locked; a Ctrl-C or
        SIGTERM waits for its end (interrupts.py)."""
        for attempt in range(self.retries):
            try:
                with Session(self._writer, expire_on_commit=False) as session, session.begin():
                    result = fn(session)
                    fault_point("store.commit")  # test-only: a kill here leaves an uncommitted transaction
                    return result
            except OperationalError as err:
                if connection_lost(err):
                    raise self.unreachable(err) from None
                if unusable(err):  # a full disk, a file made read-only or immutable: one line
                    raise StoreError(self.why(err)) from None
                locked = "locked" in str(err) or "busy" in str(err)
                if not locked or attempt == self.retries - 1:
                    raise
                time.sleep(0.05 * 2 ** attempt)
            except DBAPIError as err:  # e.g. the file damaged under the writer
                if unusable(err):
                    raise StoreError(self.why(err)) from None
                raise
        raise AssertionError("unreachable")

    def _read(self, fn: Callable[[Session], T]) -> T:
        try:
            with Session(self.engine) as session, session.begin():
                return fn(session)
        except DBAPIError as err:
            if connection_lost(err):
                raise self.unreachable(err) from None
            if unusable(err):
                raise StoreError(self.why(err)) from None
            raise

    def quick_check(self) -> None:
        """SQLite's ``PRAGMA quick_check`` (linear in the file, no index rebuild): a store damaged under the
        command (truncated, overwritten) is one line now, not at the next command. Other backends: nothing."""
        if self.engine.dialect.name != "sqlite":
            return
        try:
            with self.engine.connect() as conn:
                found = conn.execute(text("PRAGMA quick_check(3)")).scalars().all()
        except DBAPIError as err:
            raise StoreError(self.why(err)) from None
        if found != ["ok"]:
            raise self._damaged(f"PRAGMA quick_check: {'; '.join(' '.join(str(f).split()) for f in found)}")

    def unreachable(self, err: DBAPIError) -> StoreError:
        """One line on a store whose server does not answer (:func:`connection_lost`)."""
        reason = " ".join(str(err.orig).split())
        return StoreError(f"cannot use store {self.display_url}: it does not answer ({reason}); what it committed "
                          f"is kept: run the command again once it answers (`milegpo train --resume RUN` goes on "
                          f"from a run's last checkpoint)")

    def _damaged(self, why: str) -> StoreError:
        return StoreError(f"store {self.display_url} is damaged: {why}; restore it from a copy")

    def _init_schema(self, session: Session, create: bool) -> None:
        """Check (and, when writable, create or upgrade) the schema; never re-create a missing table."""
        conn = session.connection()
        if conn.dialect.name == "postgresql":
            session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SCHEMA_LOCK_KEY})
        ours = set(inspect(conn).get_table_names()) & set(Base.metadata.tables)
        if not ours:
            if not create:
                raise StoreError(f"no store at {self.display_url} (the database holds no milegpo tables)")
            Base.metadata.create_all(conn)
            session.execute(insert(SchemaVersion).values(version=SCHEMA_VERSION))
            return
        version = None
        if SchemaVersion.__tablename__ in ours:
            version = session.scalar(select(func.max(SchemaVersion.version)))
        if version is None:
            raise self._damaged("it has milegpo tables but no schema version")
        if version > SCHEMA_VERSION:
            raise StoreError(f"store {self.display_url} has schema version {version}, newer than this milegpo "
                             f"supports ({SCHEMA_VERSION}): upgrade milegpo")
        if version < SCHEMA_VERSION:
            if self.read_only:
                raise StoreError(f"store {self.display_url} has schema version {version} and is read-only here: "
                                 f"open it once where it is writable to upgrade it to {SCHEMA_VERSION}")
            try:
                upgrade(conn, version, SCHEMA_VERSION)
            except DBAPIError as err:  # e.g. a table the upgrade alters is missing
                raise self._damaged(f"its upgrade from schema version {version} failed "
                                    f"({' '.join(str(err.orig).split())})") from None
            session.execute(insert(SchemaVersion).values(version=SCHEMA_VERSION))
        missing = sorted(set(Base.metadata.tables) - set(inspect(conn).get_table_names()))
        if missing:
            raise self._damaged(f"table(s) {', '.join(missing)} missing")

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

    def get_experiment(self, ref: int | str) -> dict[str, Any]:
        """By id, or by name (the newest experiment of that name)."""
        def fn(s: Session) -> list[dict[str, Any]]:
            if isinstance(ref, int) or str(ref).isdecimal():
                return _rows(s, Experiment, Experiment.id == int(ref)) if int(ref) <= MAX_ID else []
            return _rows(s, Experiment, Experiment.name == ref, order=[Experiment.id.desc()])[:1]
        rows = self._read(fn)
        if not rows:
            raise RunNotFound(f"experiment '{ref}' not found in {self.display_url}")
        return rows[0]

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

    def set_status(self, run_id: int, status: str) -> None:
        if status not in RUN_STATUSES:
            raise StoreError(f"status: unknown {status!r} (allowed: {', '.join(RUN_STATUSES)})")
        self._write(lambda s: setattr(self._run(s, run_id), "status", status))

    def set_git_commit(self, run_id: int, git_commit: str | None) -> None:
        self._write(lambda s: setattr(self._run(s, run_id), "git_commit", git_commit))

    def set_mlflow_run_id(self, run_id: int, mlflow_run_id: str) -> None:
        self._write(lambda s: setattr(self._run(s, run_id), "mlflow_run_id", mlflow_run_id))

    def get_run(self, ref: int | str) -> dict[str, Any]:
        """By id, or by name (the newest run of that name); raises RunNotFound."""
        def fn(s: Session) -> list[dict[str, Any]]:
            if isinstance(ref, int) or str(ref).isdecimal():
                return _rows(s, Run, Run.id == int(ref)) if int(ref) <= MAX_ID else []
            return _rows(s, Run, Run.name == ref, order=[Run.id.desc()])[:1]
        rows = self._read(fn)
        if not rows:
            raise RunNotFound(f"run '{ref}' not found in {self.display_url}")
        return rows[0]

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
                         episodes: Sequence[EpisodeRecord] = (), candidates: Sequence[CandidateRecord] = ()) -> None:
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
