"""A tiny training run tracked on a real MLflow tracking server (`mlflow server` on 127.0.0.1,
sqlite backend, proxied artifacts), read back through MlflowClient: params, metrics, tags and the
resolved config as an artifact."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from milegpo_cli.cli import app
from milegpo_cli.store import RunStore
from conftest import TINY_MODEL

MLFLOW = Path(sys.executable).with_name("mlflow")
TINY = [*TINY_MODEL,
        "rollout.groups=2", "rollout.group_size=2", "rollout.train_tasks=8",
        "eval.episodes=2", "eval.splits=['id']", "env.max_steps=3", "env.webshop.num_products=300",
        "env.webshop.train_instructions=80", "env.webshop.eval_instructions=8", "run.iterations=2",
        "eval.every=2", "checkpoint.every=2", "warmstart.enabled=false", "run.threads=1", "base.enabled=false",
        "eval.probe_states=6"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(uri: str, proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    """Until the `mlflow server` at ``uri`` answers /health with 200; RuntimeError with its log's tail if
    it exits or ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"mlflow server did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """`mlflow server` in its own process group, stopped with SIGTERM to the group."""
    root = tmp_path_factory.mktemp("mlflow_server")
    port = free_port()
    log = open(root / "server.log", "w")
    proc = subprocess.Popen([str(MLFLOW), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                             "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                             "--artifacts-destination", str(root / "artifacts")],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(uri, proc, root / "server.log", 90)
        yield uri, root
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.mark.slow
def test_training_run_on_a_tracking_server(mlflow_server, tmp_path):
    from mlflow.tracking import MlflowClient

    uri, root = mlflow_server
    result = CliRunner().invoke(app, ["train", "-r", "webshop", *[a for kv in TINY for a in ("--set", kv)],
                                      "--runs-dir", str(tmp_path), "--mlflow-uri", uri])
    assert result.exit_code == 0, result.output
    with RunStore(tmp_path / "milegpo.db") as store:
        run = store.get_run(1)
        iterations = store.iterations(1)
        evaluations = store.evaluations(1)
    assert not (tmp_path / "mlflow.db").exists()  # nothing tracked locally

    client = MlflowClient(uri)
    mr = client.get_run(run["mlflow_run_id"])
    assert mr.info.status == "FINISHED" and mr.info.run_name == run["name"]
    assert mr.data.tags["milegpo.run_id"] == "1"
    assert mr.data.params["env.name"] == "webshop" and mr.data.params["rollout.groups"] == "2"
    assert mr.data.params["ppo.lr"] == str(run["config"]["ppo"]["lr"])
    history = client.get_metric_history(mr.info.run_id, "success_rate")
    assert [(m.step, m.value) for m in history] == [(i["iteration"], i["metrics"]["success_rate"]) for i in iterations]
    logged = {(key, m.step): m.value for key in mr.data.metrics if key.endswith("/success_rate")
              for m in client.get_metric_history(mr.info.run_id, key)}
    assert "train" in {e["phase"] for e in evaluations}
    for e in evaluations:  # each stored evaluation (eval_id/..., eval_untrained_id/...) at its iteration
        assert any(key.endswith(f"_{e['split']}/success_rate") and step == e["iteration"]
                   and value == e["metrics"]["success_rate"] for (key, step), value in logged.items()), (e, logged)
    assert [a.path for a in client.list_artifacts(mr.info.run_id)] == ["config.json"]
    config = json.loads(Path(client.download_artifacts(mr.info.run_id, "config.json", str(tmp_path))).read_text())
    assert config == run["config"]
    assert list((root / "artifacts").rglob("config.json"))  # uploaded through the server's artifact proxy
