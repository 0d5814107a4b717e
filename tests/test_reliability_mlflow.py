"""An MLflow tracking server that does not answer (issue 35, docs/reliability.md): at the start,
`train` fails in seconds with one line and stores nothing; during a run (a real `mlflow server`
stopped mid-run), training goes on, the metrics are kept and back-filled when the server is back, or
reported in one warning when it never comes back, then sent by `train --resume` once it is."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402
from rich.console import Console  # noqa: E402

from milegpo_cli.store import RunStore  # noqa: E402
from milegpo_cli.store import tracking  # noqa: E402
from test_reliability_crash import milegpo, models_dir, new_root, train_args  # noqa: E402,F401 (fixture)
from test_resume_mlflow import TINY  # noqa: E402
from test_tracking_server import free_port, wait_healthy  # noqa: E402

MLFLOW = Path(sys.executable).with_name("mlflow")


class Server:
    """`mlflow server` on a fixed port and backend, stopped and started again at will."""

    def __init__(self, root: Path):
        self.root, self.port = root, free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.root / "server.log", "a")
        self.proc = subprocess.Popen([str(MLFLOW), "server", "--host", "127.0.0.1", "--port", str(self.port),
                                      "--workers", "1", "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
                                      "--artifacts-destination", str(self.root / "artifacts")],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_healthy(self.uri, self.proc, self.root / "server.log", 120)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def test_unreachable_server_fails_fast_in_one_line_and_stores_nothing(tmp_path, models_dir):  # noqa: F811
    root = new_root(tmp_path, "runs", models_dir)
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    start = time.monotonic()
    res = milegpo([*train_args(root), "--mlflow-uri", uri], tmp_path, timeout=120)
    elapsed = time.monotonic() - start
    assert res.returncode == 2, res.stdout + res.stderr
    [line] = res.stderr.strip().splitlines()
    assert line.startswith(f"error: MLflow tracking server {uri} does not answer (connection refused)")
    assert "drop --mlflow-uri" in line
    assert elapsed < 15, elapsed
    if (root / "milegpo.db").exists():
        with RunStore(root / "milegpo.db") as store:
            assert store.list_runs() == []  # no orphan run left "created"


def train_with_server_events(tmp_path, monkeypatch, server: Server, events: dict) -> tuple[RunStore, int]:
    """A tiny in-process run of 5 iterations tracked on ``server``; ``events``: iteration -> action
    run just before that iteration (the server stopped or started mid-run)."""
    os.environ.setdefault("ALFWORLD_DATA", str(Path(__file__).resolve().parents[1] / "runs" / "alfworld_data"))
    from milegpo_cli.config import load_config
    from milegpo_cli.trainer import loop

    config = load_config("webshop", [*TINY, "run.iterations=5", "checkpoint.every=5", "eval.every=5",
                                      f"store.root={json.dumps(str(tmp_path))}", f"store.mlflow_uri={json.dumps(server.uri)}"])
    real = loop.train_iteration

    def with_events(cfg, *args, **kw):
        events.pop(args[-1], lambda: None)()
        return real(cfg, *args, **kw)

    monkeypatch.setattr(loop, "train_iteration", with_events)
    store = RunStore(config.store.db)
    run_id = loop.train(config, store, server.uri, console=Console(file=open(os.devnull, "w"), width=120))
    return store, run_id


@pytest.mark.slow
def test_server_stopped_mid_run_training_goes_on_and_mlflow_is_back_filled(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tracking, "RETRY_S", 0.0)  # try at every iteration (30 s in real runs)
    server = Server(tmp_path)
    server.start()
    try:
        # stopped before iteration 2, back before iteration 4: iterations 2 and 3 are sent late
        store, run_id = train_with_server_events(tmp_path / "a", monkeypatch, server,
                                                 {2: server.stop, 4: server.start})
        err = capsys.readouterr().err
        assert f"MLflow tracking server {server.uri} does not answer (connection refused); training goes on" in err
        assert f"MLflow tracking server {server.uri} answers again; the kept metrics were sent" in err
        run = store.get_run(run_id)
        assert run["status"] == "finished" and len(store.iterations(run_id)) == 5
        client = MlflowClient(server.uri)
        history = client.get_metric_history(run["mlflow_run_id"], "success_rate")
        assert [(m.step, m.value) for m in history] == [(i["iteration"], i["metrics"]["success_rate"])
                                                        for i in store.iterations(run_id)]
        assert client.get_run(run["mlflow_run_id"]).info.status == "FINISHED"

        # stopped before iteration 3 and never back: the run still finishes; one warning says what MLflow
        # misses and which command sends it
        store, run_id = train_with_server_events(tmp_path / "b", monkeypatch, server, {3: server.stop})
        err = capsys.readouterr().err
        run = store.get_run(run_id)
        assert run["status"] == "finished" and len(store.iterations(run_id)) == 5
        assert f"MLflow run {run['mlflow_run_id']} misses" in err
        assert "(steps 3..5) and stays marked running; the store holds them all" in err
        assert f"`milegpo train --resume {run_id} --runs-dir " in err and "sends them once the server answers" in err
        assert "Traceback" not in err

        # the server back, the next command that opens the run sends what MLflow missed, in one line
        server.start()
        from milegpo_cli.config import Config
        from milegpo_cli.trainer import loop

        loop.train(Config.from_dict(run["config"]), store, server.uri, resume_run=run_id,
                   console=Console(file=open(os.devnull, "w"), width=120))
        err = capsys.readouterr().err
        [line] = [line for line in err.splitlines() if "lacked" in line]
        assert line.startswith(f"warning: MLflow run {run['mlflow_run_id']} lacked ")
        assert "(steps 3..5) logged while its tracking server was away; sent now from the store" in line
        client = MlflowClient(server.uri)
        history = client.get_metric_history(run["mlflow_run_id"], "success_rate")
        assert [(m.step, m.value) for m in history] == [(i["iteration"], i["metrics"]["success_rate"])
                                                        for i in store.iterations(run_id)]
        [final] = [e for e in store.evaluations(run_id) if e["iteration"] == 5]
        evals = client.get_metric_history(run["mlflow_run_id"], f"eval_{final['split']}/success_rate")
        assert [(m.step, m.value) for m in evals] == [(5, final["metrics"]["success_rate"])]
        assert client.get_run(run["mlflow_run_id"]).info.status == "FINISHED"
        assert store.get_run(run_id)["status"] == "finished" and len(store.iterations(run_id)) == 5
    finally:
        server.stop()
