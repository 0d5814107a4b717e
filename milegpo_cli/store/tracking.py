"""MLflow mirror of a store run: params, per-iteration metrics (batched), artifacts.

One MLflow run per store run, tagged with the store's run id (``milegpo.run_id``) while the store
keeps the MLflow run id, so each points at the other. ``MlflowClient`` only, no fluent global
state, so several trackers can live in one process. ``log_batch`` because one ``log_metric`` call
costs ~20 ms against ~0.3 s for a 2,000-point batch (notes/stack-facts.md).

Resume: a run resumed from the checkpoint of iteration k replays iterations k+1.. that the crashed
process may already have logged. MLflow cannot delete a metric point, so a resumed tracker skips
every (metric, step) the run already holds: each step appears once in MLflow as in the store (the
first value logged; the replay logs the same values, the resume being exact, docs/reliability.md).
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import os
import numbers
import time
from pathlib import Path
from typing import Any, Mapping

from milegpo_cli.config import flatten
from milegpo_cli.interrupts import deferred_interrupts

EXPERIMENT = "milegpo"
PARAM_BATCH = 100  # MLflow's limit of params per log_batch
METRIC_BATCH = 1000  # MLflow's limit of metrics per log_batch
PARAM_MAX_CHARS = 6000


def _artifact_root(tracking_uri: str) -> str | None:
    """Artifacts of a local sqlite store live beside its db (``runs/mlartifacts``); servers decide."""
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri.removeprefix("sqlite:///"))
        return (db.parent.resolve() / "mlartifacts").as_uri()
    return None


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
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class Tracker:
    def __init__(self, tracking_uri: str, experiment: str = EXPERIMENT):
        from mlflow.tracking import MlflowClient

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # silence the db-migration INFO lines

        self.uri = tracking_uri
        with deferred_interrupts(), _creation_lock(tracking_uri):
            self.client = MlflowClient(tracking_uri)
            found = self.client.get_experiment_by_name(experiment)
            self.experiment_id = found.experiment_id if found else self.client.create_experiment(
                experiment, artifact_location=_artifact_root(tracking_uri))
        self.run_id: str | None = None
        self._logged: dict[str, set[int]] = {}  # metric -> steps the run held when resumed

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

    @deferred_interrupts()
    def resume(self, run_id: str) -> str:
        """Continue an existing MLflow run (after a crash) and mark it running again; the steps it
        already holds are not logged again (module docstring)."""
        run = self.client.get_run(run_id)  # raises if it does not exist
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

    @deferred_interrupts()
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """All finite numeric metrics of one step in one batch (nested dicts are flattened)."""
        from mlflow.entities import Metric

        run_id = self._require_run()
        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in flatten(metrics).items()
                 if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
                 and step not in self._logged.get(k, ())]
        for i in range(0, len(items), METRIC_BATCH):
            self.client.log_batch(run_id, metrics=items[i:i + METRIC_BATCH])

    @deferred_interrupts()
    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self._require_run(), tags=[RunTag(k, str(v)) for k, v in tags.items()])

    @deferred_interrupts()
    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self._require_run(), str(path), artifact_path)

    @deferred_interrupts()
    def end(self, status: str = "FINISHED") -> None:
        """status: FINISHED, FAILED or KILLED."""
        self.client.set_terminated(self._require_run(), status=status)
