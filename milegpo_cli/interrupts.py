"""Ctrl-C, SIGTERM and SIGHUP wait for the end of a database write.

A ``KeyboardInterrupt`` raised in the middle of a transaction (the run store's, MLflow's) can leave
its connection open and holding SQLite's write lock: the cleanup that then marks the run killed
fails with "database is locked" and the run ends marked failed, or not at all. A write wrapped in
:func:`deferred_interrupts` runs to its end; a SIGINT or SIGTERM that arrived meanwhile is then
re-raised, so the process's own handler (``KeyboardInterrupt``, cli.py's SIGTERM handler) runs
right after the write, as if the signal had come a moment later.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

DEFERRED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


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
