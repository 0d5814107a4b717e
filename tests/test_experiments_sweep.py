"""sweep: grid parsing, then a tiny WebShop sweep end to end with report's variants table and compare."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_experiments_ablate import TINY, quiet

from milegpo_cli.config import load_config
from milegpo_cli.experiments.compare import compare
from milegpo_cli.experiments.report import build_report
from milegpo_cli.experiments.runs import ExperimentError
from milegpo_cli.experiments.sweep import MAX_UNCONFIRMED, members, parse_grid, run_sweep
from milegpo_cli.store import RunStore


def test_grid_values_and_members():
    config = load_config("webshop", TINY)
    grid = parse_grid(config, ["ppo.lr=1e-4,3e-4", 'eval.splits=["id"],["id", "ood"]'])
    assert grid == [("ppo.lr", [1e-4, 3e-4]), ("eval.splits", [["id"], ["id", "ood"]])]
    ms = members(config, grid[:1], 2)
    assert [m.label for m in ms] == ["milegpo ppo.lr=0.0001 s0", "milegpo ppo.lr=0.0001 s1",
                                     "milegpo ppo.lr=0.0003 s0", "milegpo ppo.lr=0.0003 s1"]
    for bad, match in [("ppo.nope=1,2", "unknown config key"), ("run.seed=1,2", "not a sweep key"),
                       ("ppo.lr", "expected"), ("ppo.lr=1,1", "repeated")]:
        with pytest.raises(ExperimentError, match=match):
            parse_grid(config, [bad])
    with pytest.raises(ExperimentError, match="ppo.lr"):
        members(config, parse_grid(config, ["ppo.lr=fast"]), 1)  # a string where a number goes
    with pytest.raises(ExperimentError, match="at least one"):
        parse_grid(config, [])


@pytest.mark.slow
def test_sweep_resumes_and_reports_its_variants(tmp_path):
    config = load_config("webshop", [*TINY, f"store.root={json.dumps(str(tmp_path))}"])
    store = RunStore(config.store.db)
    exp_id = run_sweep(config, store, config.store.mlflow_uri, ["ppo.lr=1e-4,3e-4"], 2, quiet())
    exp = store.get_experiment(exp_id)
    assert exp["kind"] == "sweep" and exp["name"].startswith("sweep-webshop-")
    runs = store.list_runs(exp_id)
    assert sorted((r["config"]["ppo"]["lr"], r["seed"]) for r in runs) == [(1e-4, 0), (1e-4, 1), (3e-4, 0), (3e-4, 1)]
    assert all(r["status"] == "finished" for r in runs)

    from mlflow.tracking import MlflowClient

    client = MlflowClient(config.store.mlflow_uri)
    assert {client.get_run(r["mlflow_run_id"]).data.tags["mlflow.parentRunId"] for r in runs} == {exp["mlflow_run_id"]}

    store.set_status(runs[0]["id"], "failed")  # resumed in place; the finished members are not trained again
    assert run_sweep(config, store, config.store.mlflow_uri, ["ppo.lr=1e-4,3e-4"], 2, quiet()) == exp_id
    assert [r["id"] for r in store.list_runs(exp_id)] == [r["id"] for r in runs]
    assert store.list_runs(exp_id)[0]["status"] == "finished"

    rep = build_report(store, exp_id, metric="score_ood")
    variants = rep.data["variants"]
    assert set(variants["variants"]) == {"milegpo ppo.lr=0.0001", "milegpo ppo.lr=0.0003"}
    assert variants["metric"] == "score_ood" and variants["best"] in variants["variants"]
    other = next(v for k, v in variants["variants"].items() if k != variants["best"])
    assert other["best_vs_this"]["paired_seeds"] == [0, 1] and other["summary"]["n"] == 2
    assert rep.tables[0].columns[:4] == ["variant", "seeds", "score_ood", "IQM score_ood"]
    assert build_report(store, exp_id).data["variants"]["metric"] == "success_id"  # a sweep's default
    with pytest.raises(ExperimentError, match="metric"):
        build_report(store, exp_id, metric="speed")
    assert {r["method"] for r in compare(store, [f"exp:{exp_id}"], tmp_path / "cmp")["runs"]} == set(variants["variants"])


def test_grid_values_that_make_one_setting_are_refused():
    """``0`` and ``0.0`` of a float key trained two identical members (and after a kill -9 both mapped
    to one run, the other left running): refused in one line, compared after the config's conversion."""
    config = load_config("webshop", TINY)
    for text in ["ppo.entropy_coef=0,0.0", "ppo.lr=1,1.0", "ppo.entropy_coef=0.01,0,0.0"]:
        with pytest.raises(ExperimentError, match="are the same setting"):
            parse_grid(config, [text])
    assert parse_grid(config, ["ppo.entropy_coef=0,0.01"]) == [("ppo.entropy_coef", [0, 0.01])]


def test_a_huge_grid_needs_yes_before_anything_is_registered(tmp_path):
    config = load_config("webshop", [*TINY, f"store.root={json.dumps(str(tmp_path))}"])
    store = RunStore(config.store.db)
    lrs = ",".join(f"{i}e-6" for i in range(1, 27))
    ents = ",".join(f"{i / 1000}" for i in range(1, 21))
    assert 26 * 20 > MAX_UNCONFIRMED
    with pytest.raises(ExperimentError, match=r"the grid makes 520 members \(520 variants x 1 seeds\), more than "
                                              r"500; .* pass --yes to go on"):
        run_sweep(config, store, None, [f"ppo.lr={lrs}", f"ppo.entropy_coef={ents}"], 1, None)
    assert store.list_experiments() == [] and store.list_runs() == []


def test_a_huge_grid_refused_by_the_cli_creates_nothing(tmp_path):
    """`sweep` without --yes over the limit: one line, exit 2, and no store, MLflow store or folder (the
    CLI created the empty store before the check)."""
    runs = tmp_path / "runs"
    lrs = ",".join(f"{i}e-6" for i in range(1, 27))
    ents = ",".join(f"{i / 1000}" for i in range(1, 21))
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "milegpo_cli", "sweep", "--recipe", "webshop", "--grid", f"ppo.lr={lrs}",
                           "--grid", f"ppo.entropy_coef={ents}", "--seeds", "1", "--runs-dir", str(runs)],
                          capture_output=True, text=True, cwd=root, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("error: sweep: the grid makes 520 members"), proc.stderr
    assert not runs.exists()
