"""Experiment drivers that stop when told and fail fast (issue 45, items 1, 2 and 10's SIGHUP): a
signal to an ``ablate --parallel`` or ``--ray`` driver stops its members at once, marks them killed
in the store and MLflow, prints one line and exits 128 + the signal; ``--ray`` to an address where
no Ray cluster answers is one line within the connect timeout and creates nothing."""
from __future__ import annotations

import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from milegpo_cli.store import RunStore
from milegpo_cli.trainer.checkpoint import list_checkpoints
from test_experiments_ablate import TINY  # noqa: E402  (tests/ is on sys.path: rootdir-relative imports)

ROOT = Path(__file__).resolve().parents[1]
LONG = [a for s in TINY if not s.startswith(("run.iterations", "eval.every")) for a in ("--set", s)] + [
    "--set", "run.iterations=200", "--set", "eval.every=100"]


# `milegpo` as a terminal starts it: SIGHUP at its default even where pytest runs under `nohup`, which
# would hand the ignored SIGHUP down (and milegpo rightly keeps an ignored SIGHUP ignored).
AS_FROM_A_TERMINAL = ("import os, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL); "
                      "os.execv(sys.executable, [sys.executable, '-m', 'milegpo_cli', *sys.argv[1:]])")


def _cli(*args: str, env: dict | None = None, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled", "COLUMNS": "300", **(env or {})}
    return subprocess.Popen([sys.executable, "-c", AS_FROM_A_TERMINAL, *args], env=env, cwd=ROOT, text=True, **kw)


def _all_training(store: RunStore, root: Path, n: int) -> bool:
    runs = store.list_runs()
    return len(runs) == n and all(r["status"] == "running" and list_checkpoints(root / "checkpoints" / f"run_{r['id']}")
                                  for r in runs)


def _stop_and_check(proc: subprocess.Popen, sig: int, root: Path, n: int) -> str:
    """Wait until the ``n`` members train, send ``sig`` to the driver; returns its output once it
    ended (within 30 s), every member killed in the store and MLflow."""
    store = RunStore(f"sqlite:///{root / 'milegpo.db'}")
    deadline = time.monotonic() + 400
    while not _all_training(store, root, n):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.5)
    sent = time.monotonic()
    proc.send_signal(sig)
    out = proc.communicate(timeout=120)[0]
    assert time.monotonic() - sent < 30, out[-3000:]
    assert proc.returncode == 128 + sig, out[-3000:]
    assert "resume it by running the same command again" in out and "Traceback" not in out, out[-3000:]
    runs = store.list_runs()
    assert [r["status"] for r in runs] == ["killed"] * n, out[-3000:]
    assert all(r["lock_pid"] is None for r in runs)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    assert [client.get_run(r["mlflow_run_id"]).info.status for r in runs] == ["KILLED"] * n
    parent = store.get_experiment(1)["mlflow_run_id"]
    assert client.get_run(parent).info.status == "KILLED"
    store.close()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGHUP])
def test_a_signal_to_a_parallel_driver_marks_every_member_killed(tmp_path, sig):
    proc = _cli("ablate", "--recipe", "webshop", *LONG, "--no-ablations", "--seeds", "2", "--parallel", "2",
                "--runs-dir", str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    _stop_and_check(proc, sig, tmp_path, 2)


@pytest.mark.slow
def test_a_parallel_member_killed_after_the_stop_grace_is_marked_killed(tmp_path):
    """MILEGPO_STOP_GRACE=0: each ``train`` is SIGKILLed right after its SIGTERM, before it can mark its
    run; the driver marks them killed (store and MLflow) and releases their locks (they stayed running)."""
    proc = _cli("ablate", "--recipe", "webshop", *LONG, "--no-ablations", "--seeds", "2", "--parallel", "2",
                "--runs-dir", str(tmp_path), env={"MILEGPO_STOP_GRACE": "0"}, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT)
    out = _stop_and_check(proc, signal.SIGTERM, tmp_path, 2)
    assert out.count("killed after 0 s, marked killed") == 2, out[-3000:]


# --- --ray to an address where no cluster answers -------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def http_port():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


@pytest.fixture()
def silent_port():
    """A port that accepts connections and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


@pytest.mark.parametrize("where, found", [("closed", "Connection refused"), ("http", "a server that is not Ray's (it answered '<!DOCTYPE HTML>')"),
                                          ("silent", "no answer within 3 s")])
def test_ray_to_an_address_without_a_cluster_is_one_line_and_creates_nothing(tmp_path, request, where, found):
    port = {"closed": _free_port, "http": lambda: request.getfixturevalue("http_port"),
            "silent": lambda: request.getfixturevalue("silent_port")}[where]()
    runs = tmp_path / "runs"
    start = time.monotonic()
    for command in (["ablate"], ["sweep", "--grid", "ppo.lr=1e-4,3e-4"]):
        proc = _cli(*command, "--recipe", "webshop", "--ray", f"127.0.0.1:{port}", "--runs-dir", str(runs),
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    env={"MILEGPO_RAY_CONNECT_TIMEOUT": "3"})
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 2 and len(err.strip().splitlines()) == 1, err
        assert err.startswith(f"error: --ray 127.0.0.1:{port}: no Ray cluster there: {found}"), err
    assert time.monotonic() - start < 100
    assert not runs.exists()  # no store, no MLflow store, no folder


def test_a_bad_connect_timeout_is_one_line(tmp_path):
    proc = _cli("ablate", "--recipe", "webshop", "--ray", "127.0.0.1:1", "--runs-dir", str(tmp_path / "runs"),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env={"MILEGPO_RAY_CONNECT_TIMEOUT": "soon"})
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 2 and err == "error: MILEGPO_RAY_CONNECT_TIMEOUT='soon': must be a number of seconds > 0\n"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_a_signal_to_train_marks_the_run_killed(tmp_path, sig):
    """The terminal closed under `train` (SIGHUP), or `kill` (SIGTERM): the run is `killed` in the store
    and MLflow, its lock released, one line with the command that resumes it, exit 128 + the signal as
    the drivers do (130 for both before; the run `running` on SIGHUP before that)."""
    proc = _cli("train", "--recipe", "webshop", *LONG, "--runs-dir", str(tmp_path), stdout=subprocess.PIPE,
                stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not list_checkpoints(tmp_path / "checkpoints" / "run_1"):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.5)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig and err.strip().splitlines()[-1].startswith("run 1 stopped (marked killed); resume "
                                                                             "it with: milegpo train --resume 1"), err
    store = RunStore(f"sqlite:///{tmp_path / 'milegpo.db'}")
    [run] = store.list_runs()
    assert run["status"] == "killed" and run["lock_pid"] is None
    from mlflow.tracking import MlflowClient

    assert MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(run["mlflow_run_id"]).info.status == "KILLED"
    store.close()
