"""User-facing errors: each carries a one-line message naming the problem.

The CLI prints these as one red line on stderr and exits with code 2 (no traceback).
"""
from __future__ import annotations


class MilegpoError(Exception):
    """Base class of the errors that are the user's to fix (bad input, missing run...)."""


class ConfigError(MilegpoError, ValueError):
    """A recipe or override is invalid (unknown key, wrong type, bad value, TOML syntax)."""


class StoreError(MilegpoError):
    """The run store cannot be used (e.g. it was created by a newer milegpo)."""


class RunNotFound(MilegpoError, LookupError):
    """A run id or name that the store does not hold."""


class RunStopped(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped run ``run_id`` (marked killed); ``command`` resumes it."""

    def __init__(self, run_id: int, command: str):
        super().__init__(f"run {run_id} stopped")
        self.run_id, self.command = run_id, command


class ExperimentStopped(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP stopped experiment ``exp_id`` (``ablate`` / ``sweep``): its running
    members were stopped and marked killed; the same command resumes it."""

    def __init__(self, exp_id: int, name: str):
        super().__init__(f"experiment {exp_id} stopped")
        self.exp_id, self.name = exp_id, name
