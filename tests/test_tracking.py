"""MLflow mirror of a run, written to a temporary local sqlite store and read back with MlflowClient."""
import json
from pathlib import Path

import pytest

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

from milegpo_cli.config import load_config  # noqa: E402
from milegpo_cli.store.tracking import Tracker  # noqa: E402


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def test_run_params_metrics_artifacts(uri, tmp_path):
    config = load_config("alfworld")
    tracker = Tracker(uri)
    run_id = tracker.start_run("alfworld-milegpo-s0", config.to_dict(), {"milegpo.run_id": 7})
    for it in range(1, 31):
        tracker.log_metrics({"train": {"success": it / 30}, "loss": 1.0 / it, "skipped": "text",
                             "bad": float("nan")}, step=it)
    plot = tmp_path / "curve.png"
    plot.write_bytes(b"\x89PNG\r\n\x1a\n")
    tracker.log_artifact(plot, "plots")
    tracker.end("FINISHED")

    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "alfworld-milegpo-s0"
    assert run.data.tags["milegpo.run_id"] == "7"
    assert run.data.params["ppo.lr"] == str(config.ppo.lr)
    assert run.data.params["env.name"] == "alfworld"
    assert run.data.params["policy.tiny.hidden_size"] == str(config.policy.tiny.hidden_size)
    assert "skipped" not in run.data.metrics and "bad" not in run.data.metrics
    history = client.get_metric_history(run_id, "train.success")
    assert [m.step for m in history] == list(range(1, 31))
    assert history[-1].value == pytest.approx(1.0)
    assert [a.path for a in client.list_artifacts(run_id, "plots")] == ["plots/curve.png"]
    resolved = Path(client.download_artifacts(run_id, "config.json", str(tmp_path))).read_text()
    assert json.loads(resolved) == config.to_dict()  # the nested params, kept whole
    beside_db = (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
    assert run.info.artifact_uri.startswith(beside_db)


def test_resume_and_child_runs(uri):
    tracker = Tracker(uri)
    parent = tracker.start_run("experiment", {}, {"milegpo.experiment_id": 1})
    child = Tracker(uri)
    child_id = child.start_run("member", {"run": {"seed": 1}}, parent_run_id=parent)
    child.log_metrics({"loss": 2.0}, step=1)
    child.end("FAILED")

    resumed = Tracker(uri)
    resumed.resume(child_id)
    assert MlflowClient(uri).get_run(child_id).info.status == "RUNNING"
    resumed.log_metrics({"loss": 1.0}, step=2)
    resumed.end()
    client = MlflowClient(uri)
    run = client.get_run(child_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["mlflow.parentRunId"] == parent
    assert [m.value for m in client.get_metric_history(child_id, "loss")] == [2.0, 1.0]


def test_logging_before_start_is_an_error(uri):
    with pytest.raises(RuntimeError, match="start_run or resume first"):
        Tracker(uri).log_metrics({"x": 1.0}, step=0)
