"""After `train --resume`, MLflow holds each iteration's metrics once, like the store (real MLflow
sqlite store; the end-to-end case crashes a tiny WebShop run and resumes it)."""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402
from rich.console import Console  # noqa: E402

from milegpo_cli.store.tracking import Tracker  # noqa: E402
from conftest import TINY_MODEL

TINY = [*TINY_MODEL,
        "rollout.groups=2", "rollout.group_size=2", "ppo.epochs=1",
        "eval.episodes=2", "eval.splits=['id']", "eval.probe_states=6", "run.threads=1", "warmstart.enabled=false",
        "base.enabled=false", "rollout.train_tasks=8", "env.max_steps=4", "env.webshop.num_products=300",
        "env.webshop.train_instructions=80", "env.webshop.eval_instructions=8", "run.iterations=4",
        "checkpoint.every=2", "eval.every=2", "run.seed=3"]


def steps_of(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return [m.step for m in client.get_metric_history(run_id, key)]


def test_resumed_tracker_does_not_log_a_step_twice(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = Tracker(uri)
    run_id = first.start_run("r", {})
    for it in range(1, 5):  # the crashed process logged iterations 1..4 (checkpoint at 2)
        first.log_metrics({"loss": 1.0 / it, "eval_id": {"success_rate": 0.1 * it}}, step=it)
    first.end("KILLED")

    resumed = Tracker(uri)
    resumed.resume(run_id)
    for it in range(3, 7):  # the resumed process replays 3 and 4, then goes on
        resumed.log_metrics({"loss": 1.0 / it, "eval_id": {"success_rate": 0.1 * it}, "new": 1.0}, step=it)
    resumed.end()

    client = MlflowClient(uri)
    assert steps_of(client, run_id, "loss") == [1, 2, 3, 4, 5, 6]
    assert steps_of(client, run_id, "eval_id.success_rate") == [1, 2, 3, 4, 5, 6]
    assert steps_of(client, run_id, "new") == [3, 4, 5, 6]  # a metric new after the resume is logged whole
    assert client.get_run(run_id).data.metrics["loss"] == pytest.approx(1 / 6)


@pytest.mark.slow
def test_train_resume_logs_every_iteration_once(tmp_path, monkeypatch):
    os.environ.setdefault("ALFWORLD_DATA", str(Path(__file__).resolve().parents[1] / "runs" / "alfworld_data"))
    from milegpo_cli.config import load_config
    from milegpo_cli.store import RunStore
    from milegpo_cli.trainer import loop

    config = load_config("webshop", [*TINY, f"store.root={json.dumps(str(tmp_path))}"])
    store = RunStore(config.store.db)
    quiet = Console(file=open(os.devnull, "w"), width=120)
    real, calls = loop.train_iteration, []

    def crash_at_4(cfg, *args, **kw):  # iteration 3 is stored and logged, its checkpoint never written
        calls.append(args[-1])
        if len(calls) == 4:
            raise KeyboardInterrupt("simulated crash during iteration 4")
        return real(cfg, *args, **kw)

    monkeypatch.setattr(loop, "train_iteration", crash_at_4)
    with pytest.raises(KeyboardInterrupt):
        loop.train(config, store, config.store.mlflow_uri, console=quiet)
    run = store.list_runs()[-1]
    loop.train(config, store, None, resume_run=run["id"], console=quiet)
    assert calls == [1, 2, 3, 4, 3, 4]  # iteration 3 was replayed

    client = MlflowClient(config.store.mlflow_uri)
    mlflow_id = store.get_run(run["id"])["mlflow_run_id"]
    assert steps_of(client, mlflow_id, "success_rate") == [1, 2, 3, 4]
    logged = client.get_run(mlflow_id).data.metrics
    evaluated = {step for k in logged if k.startswith("eval") for step in steps_of(client, mlflow_id, k)}
    assert evaluated == {0, 2, 4}  # the starting policy, then eval.every=2
    doubled = {(k, step) for k in logged for step, n in Counter(steps_of(client, mlflow_id, k)).items() if n > 1}
    assert not doubled
    assert [it["iteration"] for it in store.iterations(run["id"])] == [1, 2, 3, 4]  # the store agrees
