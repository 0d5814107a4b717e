"""One trainer per run: the run's row names the process training it (issue 35, docs/reliability.md);
likewise one command per experiment (``ablate`` / ``sweep``, issue 45: :class:`ExperimentLock`).

``train`` takes the lock of its run before it changes anything, and a second ``train --resume`` of the
same run is refused with :class:`RunLocked` naming the holder (host, pid, age of its heartbeat). The
holder writes a heartbeat every :data:`HEARTBEAT_S` seconds from a thread. A lock is stale, and taken
over, when its heartbeat is older than :data:`STALE_S` seconds, or at once when its process is gone and
it was taken on this host. The lock is taken in one write transaction (SQLite ``BEGIN IMMEDIATE``,
PostgreSQL ``SELECT ... FOR UPDATE`` on the run's row), so of two trainers starting at once one wins.
A trainer killed before it could release its lock (SIGKILL) is released by whoever killed it
(:func:`release_killed`: the driver of an ``ablate`` / ``sweep``).

Lock writes bypass ``RunStore._write`` on purpose: they are no iteration data and do not count as
``store.commit`` fault points (envs/faults.py), which the crash tests count.
"""
from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from milegpo_cli.errors import RunNotFound, StoreError
from milegpo_cli.interrupts import deferred_interrupts
from milegpo_cli.store.models import Experiment, Run
from milegpo_cli.store.database import connection_lost, unusable

HEARTBEAT_S = 30.0
STALE_S = 120.0
T = TypeVar("T")


class RunLocked(StoreError):
    """The run is being trained by another live process."""


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def holder_alive(host: str, pid: int, heartbeat: float, now: float) -> bool:
    """A lock holds while its heartbeat is fresh and, on this host, its process lives."""
    if now - heartbeat > STALE_S:
        return False
    return pid_alive(pid) if host == socket.gethostname() else True


def refuse_if_held(run_id: int, host: str | None, pid: int | None, heartbeat: float | None,
                   mine: tuple[str, int] | None = None, what: str = "run {} is being trained") -> None:
    """Raise RunLocked when run ``run_id``'s lock (its row's ``lock_*`` columns) is held by a live
    process other than ``mine`` (host, pid); ``what``: how the message names the row and its holder."""
    now = time.time()
    if pid is None or (host, pid) == mine or not holder_alive(host, pid, heartbeat or 0.0, now):
        return
    raise RunLocked(f"{what.format(run_id)} by pid {pid} on host {host} (heartbeat {now - heartbeat:.0f} s "
                    f"ago): wait for it to end, or stop that process; a lock whose process is gone is taken over")


def _transaction(store, fn: Callable[[Session], T]) -> T:
    """``fn`` in one write transaction of ``store``; a store that does not answer is a StoreError."""
    try:
        with Session(store.engine.execution_options(write=True)) as s, s.begin():
            return fn(s)
    except DBAPIError as err:
        if connection_lost(err):
            raise store.unreachable(err) from None
        if unusable(err):  # a full disk: release() leaves the lock, taken over once its process is gone
            raise StoreError(store.why(err)) from None
        raise


@deferred_interrupts()
def release_killed(store, run_id: int) -> bool:
    """Mark run ``run_id`` killed and clear its lock if it is still ``running``: its trainer was killed
    (SIGKILL after the stop grace of an ``ablate`` / ``sweep`` driver) before it could do so itself.
    The caller knows that trainer dead. True when the run was marked."""
    def fn(s: Session) -> bool:
        marked = s.execute(update(Run).where(Run.id == run_id, Run.status == "running").values(
            status="killed", lock_host=None, lock_pid=None, lock_heartbeat=None))
        return marked.rowcount == 1
    return _transaction(store, fn)


class RunLock:
    """The lock of run ``run_id`` in ``store`` for this process (a context manager)."""

    model: type = Run
    what = "run {} is being trained"

    def __init__(self, store, run_id: int):
        self.store, self.run_id = store, run_id
        self.host, self.pid = socket.gethostname(), os.getpid()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _tx(self, fn: Callable[[Session], T]) -> T:
        return _transaction(self.store, fn)

    @deferred_interrupts()
    def acquire(self) -> RunLock:
        """Take the lock (or raise RunLocked) and start the heartbeat."""
        def fn(s: Session) -> None:
            run = s.get(self.model, self.run_id, with_for_update=True)
            if run is None:
                raise RunNotFound(f"{self.what.split()[0]} {self.run_id} not found in {self.store.display_url}")
            refuse_if_held(self.run_id, run.lock_host, run.lock_pid, run.lock_heartbeat, mine=(self.host, self.pid),
                           what=self.what)
            run.lock_host, run.lock_pid, run.lock_heartbeat = self.host, self.pid, time.time()
        self._tx(fn)
        self._thread = threading.Thread(target=self._beat, name=f"run-{self.run_id}-lock", daemon=True)
        self._thread.start()
        return self

    def _mine(self):
        m = self.model
        return update(m).where(m.id == self.run_id, m.lock_host == self.host, m.lock_pid == self.pid)

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._tx(lambda s: s.execute(self._mine().values(lock_heartbeat=time.time())))
            except Exception:  # noqa: BLE001 - a missed beat is retried; a lock 4 beats old is stale
                continue

    @deferred_interrupts()
    def release(self) -> None:
        """Stop the heartbeat and clear the lock if this process still holds it. A store that does not
        answer keeps the lock, which goes stale after :data:`STALE_S` seconds and is taken over."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with contextlib.suppress(StoreError):
            self._tx(lambda s: s.execute(self._mine().values(lock_host=None, lock_pid=None, lock_heartbeat=None)))

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class ExperimentLock(RunLock):
    """The lock of experiment ``run_id`` for the ``ablate`` / ``sweep`` command running it: a second
    command of the same experiment is refused naming the first, so no member is trained twice."""

    model = Experiment
    what = "experiment {} is being run"
