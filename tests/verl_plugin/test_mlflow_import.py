"""``milegpo runs import-mlflow``: a run logged by verl's own MLflow logger (verl.utils.tracking.Tracking,
a real sqlite tracking store) becomes a milegpo run that ``runs show`` and ``compare`` read."""
import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
from omegaconf import OmegaConf
from verl.utils.tracking import Tracking

ROOT = Path(__file__).resolve().parents[2]


def milegpo(*args, env=None):
    return subprocess.run([sys.executable, "-m", "milegpo_cli", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_a_verl_mlflow_run_is_imported_and_compared(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    config = OmegaConf.to_container(OmegaConf.create({"algorithm": {"adv_estimator": "milegpo_gigpo"}, "data": {"seed": 3},
                               "actor_rollout_ref": {"rollout": {"agent": {"default_agent_loop": "milegpo_alfworld"}}}}))  # as verl's trainer passes it
    tracking = Tracking(project_name="milegpo", experiment_name="verl-gigpo", default_backend=["mlflow"], config=config)
    mlflow_run_id = mlflow.active_run().info.run_id
    for step in (1, 2, 3):
        tracking.log({"critic/score/mean": 0.1 * step, "perf/throughput": 1000.0 + step, "val-core/x/acc@1": 0.5}, step)
    del tracking  # verl's Tracking ends its MLflow run when collected
    mlflow.end_run()
    runs_dir = tmp_path / "runs"

    done = milegpo("runs", "import-mlflow", mlflow_run_id, "--from", uri, "--runs-dir", str(runs_dir))
    assert done.returncode == 0, done.stderr
    shown = milegpo("runs", "show", "verl-gigpo", "--json", "--runs-dir", str(runs_dir))
    doc = json.loads(shown.stdout)
    assert doc["run"]["algo"] == "gigpo" and doc["run"]["seed"] == 3 and doc["run"]["status"] == "finished"
    assert doc["run"]["mlflow_run_id"] == mlflow_run_id and doc["run"]["recipe"] == "verl"
    assert [it["iteration"] for it in doc["iterations"]] == [1, 2, 3]
    assert doc["iterations"][1]["metrics"]["perf/throughput"] == 1002.0
    assert doc["iterations"][2]["metrics"]["val-core/x/acc_at_1"] == 0.5  # verl's MLflow key sanitising
    compared = milegpo("compare", "verl-gigpo", "--json", "--runs-dir", str(runs_dir), "--out", str(tmp_path / "plots"))
    assert compared.returncode == 0, compared.stderr
    assert json.loads(compared.stdout)["runs"][0]["iterations"] == 3

    again = milegpo("runs", "import-mlflow", mlflow_run_id, "--from", uri, "--runs-dir", str(runs_dir))
    assert again.returncode == 2 and "is already run 1" in again.stderr and "Traceback" not in again.stderr
    missing = milegpo("runs", "import-mlflow", "0" * 32, "--from", uri, "--runs-dir", str(runs_dir))
    assert missing.returncode == 2 and "not found" in missing.stderr and "Traceback" not in missing.stderr
