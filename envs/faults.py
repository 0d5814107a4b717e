"""Test-only fault injection at named points (issue 8, docs/reliability.md).

``MILEGPO_FAULT`` holds comma-separated rules ``point:N[+][:action]``: the N-th time this process
reaches ``point`` (every time from the N-th on with ``+``), ``fault_point(point)`` performs
``action``:

    kill   SIGKILL this process (default): the crash a power cut or the OOM killer gives
    raise  raise :class:`InjectedFault`
    hang   sleep for an hour (a timeout must end it)
    flag   return True: the caller corrupts its own value (e.g. NaN advantages)
    enospc raise ``OSError(ENOSPC)``: the disk is full

Unset (the normal case) it costs one environment lookup. This module is in ``envs`` because envs is
the lowest layer, so every layer may call it.
"""
from __future__ import annotations

import errno
import functools
import os
import signal
import time
from collections import Counter

ENV_VAR = "MILEGPO_FAULT"
ACTIONS = ("kill", "raise", "hang", "flag", "enospc")
HANG_S = 3600.0

_hits: Counter[str] = Counter()


class InjectedFault(RuntimeError):
    """Raised by a ``raise`` rule."""


@functools.lru_cache(maxsize=8)
def parse_rules(spec: str) -> tuple[tuple[str, int, bool, str], ...]:
    """``"env.step:3:raise,store.commit:2"`` -> ((point, n, from_n_on, action), ...)."""
    rules = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        parts = item.split(":")
        if len(parts) not in (2, 3) or not parts[0] or not parts[1].rstrip("+").isdigit():
            raise ValueError(f"{ENV_VAR}: bad rule {item!r} (expected point:N[+][:action])")
        action = parts[2] if len(parts) == 3 else "kill"
        if action not in ACTIONS:
            raise ValueError(f"{ENV_VAR}: unknown action {action!r} in {item!r} (allowed: {', '.join(ACTIONS)})")
        rules.append((parts[0], int(parts[1].rstrip("+")), parts[1].endswith("+"), action))
    return tuple(rules)


def fault_point(point: str) -> bool:
    """Count a hit of ``point``; perform the matching rule's action (True only for ``flag``)."""
    spec = os.environ.get(ENV_VAR)
    if not spec:
        return False
    _hits[point] += 1
    n = _hits[point]
    for name, at, onward, action in parse_rules(spec):
        if name != point or not (n == at or (onward and n > at)):
            continue
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if action == "raise":
            raise InjectedFault(f"injected fault at {point} (hit {n})")
        if action == "enospc":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if action == "hang":
            time.sleep(HANG_S)
        return True
    return False
