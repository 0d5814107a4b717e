"""A run store's database: engine, opening, schema, and the transactions every query runs in.

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
open (corrupt or foreign file, unknown URL, unreachable server), and a write that meets a full disk,
a read-only or damaged file, is a one-line :class:`StoreError`. The queries are repo.py's.
"""
from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, event, func, inspect, insert, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, OperationalError
from sqlalchemy.orm import Session

from envs.faults import fault_point
from milegpo_cli.errors import StoreError
from milegpo_cli.interrupts import deferred_interrupts
from milegpo_cli.store.migrations import upgrade
from milegpo_cli.store.models import SCHEMA_VERSION, Base, SchemaVersion

BUSY_TIMEOUT_S = 60.0
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


class Database:
    """One database URL (``sqlite:///runs/milegpo.db``, ``postgresql://...``), opened and checked."""


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

    def __enter__(self) -> Database:
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
