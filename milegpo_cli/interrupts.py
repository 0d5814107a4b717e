"""How a signal stops milegpo: Ctrl-C, SIGTERM and SIGHUP stop a command alike, wait for the end of a
database write, and give a child process a grace period before it is killed.

SIGTERM and SIGHUP raise ``KeyboardInterrupt`` as Ctrl-C does (:func:`install_stop_handlers`), so a
run is marked killed in the store and MLflow; the command then exits 128 + the signal that stopped
it (:func:`stop_exit_code`: 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP), as a shell reports it.

A ``KeyboardInterrupt`` raised in the middle of a transaction (the run store's, MLflow's) can leave
its connection open and holding SQLite's write lock: the cleanup that then marks the run killed
fails with "database is locked" and the run ends marked failed, or not at all. A write wrapped in
:func:`deferred_interrupts` runs to its end; a SIGINT or SIGTERM that arrived meanwhile is then
re-raised, so the process's own handler (``KeyboardInterrupt``, :func:`stop_as_interrupt`) runs
right after the write, as if the signal had come a moment later.

A stopped ``ablate`` / ``sweep`` gives each member's ``train`` SIGTERM, then SIGKILL after
:func:`stop_grace` seconds (``MILEGPO_STOP_GRACE``, default 60; docs/scale.md).
"""
from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
from typing import Iterator

from milegpo_cli.errors import MilegpoError

DEFERRED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_GRACE_ENV = "MILEGPO_STOP_GRACE"
STOP_GRACE_S = 60.0
_stopped_by = [signal.SIGINT]  # the signal that stopped the command (Ctrl-C unless a handler below says otherwise)


def stop_as_interrupt(signum, frame) -> None:
    """SIGTERM (``kill``, a scheduler, ``milegpo ablate`` stopping its members) and SIGHUP (the terminal
    closed) end a command as Ctrl-C does: a run is marked killed in the store and MLflow. Later ones
    are ignored so that the cleanup finishes."""
    signal.signal(signum, signal.SIG_IGN)
    _stopped_by.append(signum)
    raise KeyboardInterrupt


def install_stop_handlers() -> None:
    """:func:`stop_as_interrupt` for SIGTERM, and for SIGHUP unless it is ignored (``nohup``: it stays so)."""
    signal.signal(signal.SIGTERM, stop_as_interrupt)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, stop_as_interrupt)


def stop_exit_code() -> int:
    """128 + the signal that stopped this command: 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP."""
    return 128 + _stopped_by[-1]


def stop_grace() -> float:
    """Seconds a stopped child ``train`` gets to mark its run killed before SIGKILL: ``MILEGPO_STOP_GRACE``
    (default 60; 0 kills at once)."""
    text = os.environ.get(STOP_GRACE_ENV, "")
    try:
        value = float(text) if text else STOP_GRACE_S
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise MilegpoError(f"{STOP_GRACE_ENV}={text!r}: must be a number of seconds >= 0")
    return value


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Hold SIGINT and SIGTERM for the duration of the block, then deliver them (usable as a decorator).

    Only the main thread receives signals in Python, and only handlers set from Python can be put back:
    otherwise the block runs unchanged. Nested blocks hand a held signal outwards: it is delivered when
    the outermost block ends."""
    if threading.current_thread() is not threading.main_thread() or None in map(signal.getsignal, DEFERRED):
        yield
        return
    received: list[int] = []
    previous = {}
    try:
        for sig in DEFERRED:  # a signal between these two calls: the first handler is still put back
            previous[sig] = signal.signal(sig, lambda signum, _frame: received.append(signum))
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(received):
            signal.raise_signal(sig)
