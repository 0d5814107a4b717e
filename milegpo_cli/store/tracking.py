"""MLflow mirror of a store run: params, per-iteration metrics (batched), artifacts.

One MLflow run per store run, tagged with the store's run id (``milegpo.run_id``) while the store
keeps the MLflow run id, so each points at the other. ``MlflowClient`` only, no fluent global
state, so several trackers can live in one process. ``log_batch`` because one ``log_metric`` call
costs ~20 ms against ~0.3 s for a 2,000-point batch (notes/stack-facts.md).

Resume: a run resumed from the checkpoint of iteration k replays iterations k+1.. that the crashed
process may already have logged. MLflow cannot delete a metric point, so a resumed tracker skips
every (metric, step) the run already holds: each step appears once in MLflow as in the store (the
first value logged; the replay logs the same values, the resume being exact, docs/reliability.md).

A tracking server (``http(s)://``) is asked once, without retries, when the tracker opens: one that
does not answer within :data:`PROBE_TIMEOUT_S` is a :class:`TrackingUnavailable` error before anything
is stored. Once a run is under way, the server going away does not stop training (the store is the
record): metric batches that cannot be sent are kept in memory, the console says so once, and they
are sent in order, back-filling MLflow, at the first call at least :data:`RETRY_S` seconds later that
finds the server back. Points still unsent when the run ends are reported in one warning naming the
command that sends them: the next command that opens the run (``train --resume``) sends every point
the store holds and MLflow lacks (:meth:`Tracker.backfill`), and says so in one line.
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import numbers
import os
import re
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from envs.os_environ import os_environ
from milegpo_cli.config import flatten
from milegpo_cli.errors import MilegpoError
from milegpo_cli.interrupts import deferred_interrupts

EXPERIMENT = "milegpo"
PARAM_BATCH = 100  # MLflow's limit of params per log_batch
METRIC_BATCH = 1000  # MLflow's limit of metrics per log_batch
PARAM_MAX_CHARS = 6000
PROBE_TIMEOUT_S = 5  # the first request to a tracking server, no retries
SEND_TIMEOUT_S = 10  # a request during the run, no retries (the batch is kept and sent later)
RETRY_S = 30.0  # while a server is down, seconds between attempts to send the kept batches
GATEWAY_ERRORS = (502, 503, 504)


class TrackingUnavailable(MilegpoError):
    """The MLflow tracking server does not answer, or does not hold the run to resume."""


def _is_server(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


@contextlib.contextmanager
def _http_limits(uri: str, timeout_s: int) -> Iterator[None]:
    """MLflow's REST client with no retries and a short timeout (its defaults retry for ~4 minutes)."""
    if not _is_server(uri):
        yield
        return
    with os_environ(MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT=str(timeout_s)):
        yield


def _unavailable(uri: str, why: str) -> TrackingUnavailable:
    return TrackingUnavailable(f"MLflow tracking server {uri} does not answer ({why}): start it, or run without "
                               f"it: drop --mlflow-uri (and MILEGPO_MLFLOW_URI) to track in the run folder's own "
                               f"MLflow store")


def probe_server(uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """TrackingUnavailable unless the tracking server at ``uri`` answers an HTTP request (any status)
    within ``timeout_s``; a local store passes. Standard library only: the CLI asks before it loads
    the trainer, so an unreachable server is reported in seconds."""
    import urllib.error
    import urllib.request

    if not _is_server(uri):
        return
    try:
        urllib.request.urlopen(f"{uri.rstrip('/')}/api/2.0/mlflow/experiments/get-by-name?experiment_name="
                               f"{EXPERIMENT}", timeout=timeout_s).close()
    except urllib.error.HTTPError as err:
        if err.code in GATEWAY_ERRORS:  # a proxy answered for a server that did not
            raise _unavailable(uri, f"HTTP {err.code}") from None
        return  # it answered (an error status is the tracker's business)
    except (urllib.error.URLError, OSError) as err:
        reason = str(getattr(err, "reason", err))
        raise _unavailable(uri, _why(reason, reason)) from None


def _unreachable(err: Exception) -> bool:
    """A request that got no answer from the server (refused, timed out, dropped, a gateway error), as
    MLflow words it."""
    text = str(err)
    return "API request to" in text and ("failed with exception" in text or "failed with timeout" in text
                                         or any(f"error code {code} " in text for code in GATEWAY_ERRORS))


def _why(text: str, otherwise: str) -> str:
    """Why a request failed, in a few words (MLflow's and urllib's messages run over many lines)."""
    for needle, why in (("Connection refused", "connection refused"), ("timed out", "timed out"),
                        ("timeout", "timed out"), ("Name or service not known", "unknown host")):
        if needle in text:
            return why
    code = re.search(r"error code (\d+)", text)
    return f"HTTP {code.group(1)}" if code else otherwise


def _warn(line: str) -> None:
    sys.stderr.write(f"warning: {line}\n")


def _artifact_root(tracking_uri: str) -> str | None:
    """Artifacts of a local sqlite store live beside its db (``runs/mlartifacts``); servers decide."""
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri.removeprefix("sqlite:///"))
        return (db.parent.resolve() / "mlartifacts").as_uri()
    return None


def _follow_moved_folder(db: Path, root: str) -> None:
    """Artifacts of a local sqlite store live beside it: when the folder was moved or copied, the
    locations its experiments and runs recorded (``file:///old/mlartifacts/...``) are rewritten to
    ``root``, so that nothing is written to, or re-created at, the old place."""
    con = sqlite3.connect(db, timeout=60)
    try:
        with con:
            olds = {loc for (loc,) in con.execute("SELECT artifact_location FROM experiments")
                    if loc and loc.startswith("file://") and loc.endswith("/mlartifacts") and loc != root}
            for old in olds:
                con.execute("UPDATE experiments SET artifact_location = ? WHERE artifact_location = ?", (root, old))
                con.execute("UPDATE runs SET artifact_uri = ? || substr(artifact_uri, ?) WHERE substr(artifact_uri, 1, ?) "
                            "= ?", (root, len(old) + 1, len(old) + 1, old + "/"))
    except sqlite3.Error:  # not (yet) an MLflow store of this layout: MLflow itself will say what is wrong
        pass
    finally:
        con.close()


@contextlib.contextmanager
def _creation_lock(tracking_uri: str):
    """Open a local sqlite store safely (docs/reliability.md): processes take turns (MLflow creates
    and migrates a fresh store without a lock of its own, so two at once fail in alembic), and a
    fresh store is built under a temporary name then renamed, so a process killed mid-migration
    leaves no half-migrated store behind."""
    if not tracking_uri.startswith("sqlite:///"):
        yield
        return
    from mlflow.tracking import MlflowClient

    db = Path(tracking_uri.removeprefix("sqlite:///"))
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            if not db.exists():
                for stale in db.parent.glob(f".{db.name}.*.tmp"):
                    stale.unlink()
                tmp = db.with_name(f".{db.name}.{os.getpid()}.tmp")
                MlflowClient(f"sqlite:///{tmp}").search_experiments(max_results=1)  # creates + migrates
                os.replace(tmp, db)
            else:
                _follow_moved_folder(db, _artifact_root(tracking_uri))
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class Tracker:
    def __init__(self, tracking_uri: str, experiment: str = EXPERIMENT, warn: Callable[[str], None] = _warn):
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # silence the db-migration INFO lines

        self.uri, self.warn = tracking_uri, warn
        try:
            with deferred_interrupts(), _creation_lock(tracking_uri), _http_limits(tracking_uri, PROBE_TIMEOUT_S):
                self.client = MlflowClient(tracking_uri)
                found = self.client.get_experiment_by_name(experiment)
                self.experiment_id = found.experiment_id if found else self.client.create_experiment(
                    experiment, artifact_location=_artifact_root(tracking_uri))
        except MlflowException as err:
            if "API request to" not in str(err):  # no server, or one that is no MLflow server
                raise
            raise _unavailable(tracking_uri, _why(str(err), type(err).__name__)) from None
        self.run_id: str | None = None
        self._logged: dict[str, set[int]] = {}  # metric -> steps the run held when resumed
        self._pending: list[tuple[int, list]] = []  # (step, metrics) not yet sent (module docstring)
        self._retry_at = 0.0

    @deferred_interrupts()
    def start_run(self, name: str, params: Mapping[str, Any] | None = None, tags: Mapping[str, Any] | None = None,
                  parent_run_id: str | None = None) -> str:
        """Create the MLflow run; ``params`` may be nested (the resolved config): flattened as params,
        and kept whole as the artifact ``config.json``."""
        tags = {k: str(v) for k, v in (tags or {}).items()}
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(self.experiment_id, run_name=name, tags=tags)
        self.run_id = run.info.run_id
        self.log_params(params or {})
        self.client.log_dict(self.run_id, dict(params or {}), "config.json")
        return self.run_id

    def find_run(self, tags: Mapping[str, Any]) -> str | None:
        """The oldest run of this experiment carrying every tag of ``tags`` (None: there is none): a run
        created by a command killed before it recorded the run's id (experiments/ablate.py)."""
        where = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
        found = self.client.search_runs([self.experiment_id], filter_string=where, order_by=["attributes.start_time ASC"],
                                        max_results=1)
        return found[0].info.run_id if found else None

    @deferred_interrupts()
    def resume(self, run_id: str) -> str:
        """Continue an existing MLflow run (after a crash) and mark it running again; the steps it
        already holds are not logged again (module docstring)."""
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(run_id)
        except MlflowException as err:
            if _unreachable(err) or err.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            raise TrackingUnavailable(f"MLflow run {run_id} not found in {self.uri}: pass --mlflow-uri naming "
                                      f"the MLflow store that holds it (nothing was changed)") from None
        self._logged = {k: {m.step for m in self.client.get_metric_history(run_id, k)} for k in run.data.metrics}
        self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id
        return run_id

    def _require_run(self) -> str:
        if self.run_id is None:
            raise RuntimeError("Tracker: start_run or resume first")
        return self.run_id

    @deferred_interrupts()
    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        run_id = self._require_run()
        items = [Param(k, str(v)[:PARAM_MAX_CHARS]) for k, v in flatten(params).items()]
        for i in range(0, len(items), PARAM_BATCH):
            self.client.log_batch(run_id, params=items[i:i + PARAM_BATCH])

    def _keep(self, metrics: Mapping[str, float], step: int) -> int:
        """Queue the finite numeric metrics of one step that the run does not hold yet; returns how many."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in flatten(metrics).items()
                 if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
                 and step not in self._logged.get(k, ())]
        if items:
            self._pending.append((step, items))
        return len(items)

    @deferred_interrupts()
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """All finite numeric metrics of one step in one batch (nested dicts are flattened)."""
        run_id = self._require_run()
        self._keep(metrics, step)
        self._send(run_id)

    @deferred_interrupts()
    def backfill(self, points: Iterable[tuple[int, Mapping[str, float]]]) -> None:
        """Send the (step, metrics) of a resumed run that it does not hold (logged while its server was
        away and never sent: the store's record of them); one line says how many."""
        run_id = self._require_run()
        counts = {step: self._keep(metrics, step) for step, metrics in points}
        steps = sorted(step for step, n in counts.items() if n)
        self._send(run_id, force=True)
        if steps and not self._pending:
            self.warn(f"MLflow run {run_id} lacked {sum(counts.values())} metric points (steps {steps[0]}..{steps[-1]}) "
                      "logged while its tracking server was away; sent now from the store")

    def _send(self, run_id: str, force: bool = False) -> None:
        """Send the kept batches in order; a server that does not answer keeps them (module docstring)."""
        from mlflow.exceptions import MlflowException

        if not self._pending or (not force and time.monotonic() < self._retry_at):
            return
        try:
            with _http_limits(self.uri, SEND_TIMEOUT_S):
                while self._pending:
                    items = self._pending[0][1]
                    for i in range(0, len(items), METRIC_BATCH):
                        self.client.log_batch(run_id, metrics=items[i:i + METRIC_BATCH])
                    self._pending.pop(0)
        except MlflowException as err:
            if not (_is_server(self.uri) and _unreachable(err)):
                raise
            if not self._retry_at:
                why = _why(str(err), type(err).__name__)
                self.warn(f"MLflow tracking server {self.uri} does not answer ({why}); training goes on, the store "
                          f"records everything, and metrics are sent to MLflow when it answers again")
            self._retry_at = time.monotonic() + RETRY_S
            return
        if self._retry_at:
            self.warn(f"MLflow tracking server {self.uri} answers again; the kept metrics were sent")
        self._retry_at = 0.0

    @deferred_interrupts()
    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self._require_run(), tags=[RunTag(k, str(v)) for k, v in tags.items()])

    @deferred_interrupts()
    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self._require_run(), str(path), artifact_path)

    @deferred_interrupts()
    def end(self, status: str = "FINISHED", resume: str = "") -> None:
        """status: FINISHED, FAILED or KILLED. With the server still away: one warning, no error (the
        store holds every value; ``resume``, the command that opens the run again, sends them)."""
        from mlflow.exceptions import MlflowException

        run_id = self._require_run()
        self._send(run_id, force=True)
        try:
            if not self._pending:
                with _http_limits(self.uri, SEND_TIMEOUT_S):
                    self.client.set_terminated(run_id, status=status)
                return
        except MlflowException as err:
            if not (_is_server(self.uri) and _unreachable(err)):
                raise
        steps = sorted({step for step, _ in self._pending})
        away = f"MLflow tracking server {self.uri} does not answer: MLflow run {run_id}"
        if steps:
            self.warn(f"{away} misses {sum(len(items) for _, items in self._pending)} metric points (steps "
                      f"{steps[0]}..{steps[-1]}) and stays marked running; the store holds them all"
                      + (f", and `{resume}` sends them once the server answers" if resume else ""))
        else:
            self.warn(f"{away} stays marked running" + (f"; `{resume}` ends it once the server answers" if resume else ""))
