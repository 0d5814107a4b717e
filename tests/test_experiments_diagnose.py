"""diagnose on a run written through the real RunStore from constructed rollouts."""
import json
import math
import os

import matplotlib.image as mpimg
import numpy as np
import pytest

from milegpo_cli.credit import Candidate, Rollout
from milegpo_cli.errors import RunNotFound
from milegpo_cli.experiments import diagnostics as D
from milegpo_cli.experiments.diagnose import diagnose, render_diagnosis
from milegpo_cli.experiments.plots import is_png
from milegpo_cli.store import EpisodeRecord, StepRecord

# One group = a success s0 -> s1 -> s2 -> SUCCESS (labels good, bad, good) and a failure
# s0 -> s3 -(loop)-> s3 -> FAIL (labels good, bad). Entering s1 reaches the true subgoal "picked".
SUCCESS = dict(states=["s0", "s1", "s2"], actions=["take", "look", "put"], rewards=[0.0, 0.0, 10.0],
               good=[True, False, True], subgoals=[("picked",), (), ("placed",)], stored=[0.9, 0.1, 0.5])
FAILURE = dict(states=["s0", "s3"], actions=["go", "look"], rewards=[0.0, 0.0],
               good=[True, False], subgoals=[(), ()], stored=[-0.3, -0.2])


def episode(spec, group, index, success):
    steps = [StepRecord(t=t, state_key=s, action=a, reward=r, advantage=adv, oracle_good=g, subgoals=sg)
             for t, (s, a, r, g, sg, adv) in enumerate(zip(spec["states"], spec["actions"], spec["rewards"],
                                                           spec["good"], spec["subgoals"], spec["stored"]))]
    return EpisodeRecord(task_id=f"task-{group}", split="train", task_type="pick_and_place_simple", group=group,
                         index=index, outcome=float(success), success=success, length=len(steps), steps=steps)


@pytest.fixture()
def run_id(store):
    rid = store.create_run("diag", algo="milegpo", seed=0, config={"credit": {}, "env": {"name": "alfworld"}})
    for it in range(2):
        eps, cands = [], []
        for g in ("g0", "g1"):
            eps += [episode(SUCCESS, g, 0, True), episode(FAILURE, g, 1, False)]
            cands += [Candidate(group=g, key="s1", kind="milestone", n_pos=1, n_neg=0, rho=0.4, distance=2.0,
                                progress_ok=1.0, branch_ok=math.nan, credit=0.2),
                      Candidate(group=g, key="s3", kind="trap", n_pos=0, n_neg=1, rho=-0.4, distance=math.inf,
                                progress_ok=1.0, branch_ok=math.nan, credit=-0.2)]
        store.record_iteration(rid, it, {"steps": 10.0}, eps, cands)
    return rid


def test_diagnose_auc_equals_hand_computed(store, run_id, tmp_path):
    d = diagnose(store, run_id, out_dir=tmp_path / "plots", n_resamples=200)
    by_name = {c["name"]: c for c in d["credit"]}
    stored = by_name["stored: milegpo"]
    # stored advantages: good 0.9, 0.5, -0.3; bad 0.1, -0.2 -> 0.9 and 0.5 beat both, -0.3 none: 4/6
    assert stored["auc"]["value"] == pytest.approx(4 / 6)
    assert stored["n_good"] == 12 and stored["n_bad"] == 8 and stored["n_groups"] == 4
    # the stored milestone s1 is entered with the true subgoal "picked": precision 1; recall 1/2
    # (of the subgoals "picked" and "placed" reached in each group, s1 covers "picked")
    assert stored["milestone_precision"]["value"] == pytest.approx(1.0)
    assert stored["milestone_recall"]["value"] == pytest.approx(0.5)
    # GRPO recomputed: +a on every step of the success, -a on the failure. Good: +a, +a, -a;
    # bad: +a, -a -> (0.5 + 1) * 2 + (0 + 0.5) = 3.5 of 6 pairs
    assert by_name["grpo"]["auc"]["value"] == pytest.approx(7 / 12)
    assert by_name["grpo"]["sign_accuracy"]["value"] == pytest.approx(3 / 5)
    assert {"gigpo", "graphgpo", "milegpo", "milegpo-no-reliability", "milegpo-no-progress",
            "milegpo-no-same-state"} <= set(by_name)
    for c in d["credit"]:
        auc = c["auc"]
        assert auc["low"] <= auc["value"] <= auc["high"]
    # candidates per task, evolution over both iterations, recurring keys
    assert {c["key"] for c in d["candidates"]["task-g0"]} == {"s1", "s3"}
    assert [e["milestones"] for e in d["evolution"]] == [2, 2]
    assert any(r["key"] == "s1" and r["iterations"] == [0, 1] for r in d["recurring"])
    # plots: the rollout graph and the evolution curve are real PNGs
    assert len(d["plots"]) == 2
    for p in d["plots"]:
        assert is_png(p)
        assert mpimg.imread(p).ndim == 3
    text = render_diagnosis(d, "json")
    assert json.loads(text)["iteration"] == 1
    assert len(render_diagnosis(d, "table")) >= 3


def test_diagnose_one_iteration_and_errors(store, run_id):
    d = diagnose(store, run_id, iteration=0, n_resamples=100)
    assert d["credit"][0]["n_groups"] == 2
    with pytest.raises(RunNotFound, match="run '999' not found"):
        diagnose(store, 999)
    with pytest.raises(ValueError, match="iteration"):
        diagnose(store, run_id, iteration=7)


def test_compare_estimators_matches_direct_recomputation():
    rollouts = [Rollout("g0", 0, SUCCESS["states"], SUCCESS["actions"], SUCCESS["rewards"], 1.0, True),
                Rollout("g0", 1, FAILURE["states"], FAILURE["actions"], FAILURE["rewards"], 0.0, False)]
    good = SUCCESS["good"] + FAILURE["good"]
    sub = SUCCESS["subgoals"] + FAILURE["subgoals"]
    out = D.compare_estimators(rollouts, good, sub, variants=[("grpo", "grpo", frozenset())], n_resamples=50)
    assert out[0].auc.value == pytest.approx(7 / 12)
    with pytest.raises(D.DiagnosticsError, match="labels"):
        D.compare_estimators(rollouts, good[:-1], sub)
    assert np.isfinite(out[0].sign_accuracy.value)


def test_diagnose_at_80_columns_names_every_estimator_whole(store, run_id, tmp_path):
    from rich.console import Console

    d = diagnose(store, run_id, out_dir=tmp_path / "plots", n_resamples=50)
    console = Console(width=80, record=True, file=open(os.devnull, "w"))
    for part in render_diagnosis(d, "table"):
        console.print(part)
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    rows = {line.split("  ")[0].strip() for line in text.splitlines() if line.startswith(" ")}
    assert {"stored", "grpo", "gigpo", "graphgpo", "milegpo", "milegpo -reliability", "milegpo -progress",
            "milegpo -same-state"} <= rows
    assert "…" not in text
    assert "stored = the advantages the run trained with (milegpo)" in " ".join(text.split())


def test_diagnose_json_on_the_command_line(store, run_id, tmp_path):
    from typer.testing import CliRunner

    from milegpo_cli.cli import app

    result = CliRunner().invoke(app, ["diagnose", str(run_id), "--json", "--db", str(tmp_path / "runs.db"),
                                      "--out", str(tmp_path / "plots")], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["run"]["id"] == run_id and doc["plots"]
