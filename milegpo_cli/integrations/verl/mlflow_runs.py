"""``milegpo runs import-mlflow RUN_ID``: a run that verl logged to MLflow, into milegpo's store.

verl's MLflow logger (``trainer.logger=[mlflow]``) writes the whole config as flattened params
(``algorithm/adv_estimator``, ...) and every metric at ``step`` = the global training step. The
import makes one milegpo run (recipe ``verl``, the MLflow run id linked) whose iteration k holds
every metric logged at step k, under verl's names. verl logs no per-episode records, so the
episode-derived columns (success rate, mean outcome, evaluations) stay empty and ``report``, which
ranks evaluated runs, leaves the run out. No verl import here.
"""
from __future__ import annotations

from typing import Any

from ...errors import MilegpoError

STATUS = {"FINISHED": "finished", "FAILED": "failed", "KILLED": "killed", "RUNNING": "running",
          "SCHEDULED": "created"}


class MlflowImportError(MilegpoError):
    """An MLflow run that cannot be imported (message: one line)."""


def algo_of(estimator: str) -> str:
    """Our estimator name for verl's ``algorithm.adv_estimator`` (``milegpo_gigpo`` -> ``gigpo``;
    verl's own estimators keep their names)."""
    return estimator.removeprefix("milegpo_") if estimator.startswith("milegpo_") else estimator


def import_mlflow_run(store, tracking_uri: str, mlflow_run_id: str, name: str | None = None) -> dict[str, Any]:
    """Import one verl MLflow run; returns ``{"run_id", "name", "algo", "iterations"}``. A run
    already imported (the same MLflow run id) is an error naming it."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    try:
        run = client.get_run(mlflow_run_id)
    except MlflowException as err:
        raise MlflowImportError(f"RUN_ID: MLflow run {mlflow_run_id!r} not found at {tracking_uri} "
                                f"({str(err).splitlines()[0]})") from None
    for existing in store.list_runs():
        if existing.get("mlflow_run_id") == mlflow_run_id:
            raise MlflowImportError(f"RUN_ID: MLflow run {mlflow_run_id!r} is already run {existing['id']} "
                                    f"({existing['name']!r}) of this store")
    params = run.data.params
    estimator = params.get("algorithm/adv_estimator")
    if estimator is None:
        raise MlflowImportError(f"RUN_ID: MLflow run {mlflow_run_id!r} has no param algorithm/adv_estimator: "
                                "not a run logged by verl's trainer")
    loop = params.get("actor_rollout_ref/rollout/agent/default_agent_loop", "")
    env = loop.removeprefix("milegpo_") if loop.startswith("milegpo_") else ""
    steps: dict[int, dict[str, float]] = {}
    for key in run.data.metrics:
        for m in client.get_metric_history(mlflow_run_id, key):
            steps.setdefault(int(m.step), {})[key] = float(m.value)
    name = name or run.info.run_name or mlflow_run_id
    algo = algo_of(estimator)
    seed = params.get("data/seed", "0")
    run_id = store.create_run(name, algo, seed=int(seed) if seed.isdecimal() else 0, recipe="verl",
                              config={"source": "verl", "mlflow": {"tracking_uri": tracking_uri, "run_id": mlflow_run_id},
                                      "env": {"name": env}, "verl": dict(params)})
    store.set_mlflow_run_id(run_id, mlflow_run_id)
    for step in sorted(steps):
        store.record_iteration(run_id, step, steps[step])
    store.set_status(run_id, STATUS.get(run.info.status, "finished"))
    return {"run_id": run_id, "name": name, "algo": algo, "iterations": len(steps)}
