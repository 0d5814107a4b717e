"""Credit diagnostics end to end on a small WebShop simulator (milegpo_cli/experiments/credit_bench.py)."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

from envs.webshop import WebshopConfig, WebshopSuite
from milegpo_cli.experiments import credit_bench as cb, credit_bench_report, credit_recording
from milegpo_cli.experiments.diagnostics import GroupBootstrap, roc_auc, sign_accuracy

P = (0.0, 0.5, 1.0)
GROUP = 4


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    suite = WebshopSuite(WebshopConfig(seed=0, num_products=300, train_instructions=50, eval_instructions=10))
    tasks = suite.tasks("train", 6, seed=0)
    path = tmp_path_factory.mktemp("bench") / "rollouts_webshop.jsonl.gz"
    first = credit_recording.record(suite, tasks, P, path, group_size=GROUP, seed=0, log=lambda s: None)
    again = credit_recording.record(suite, tasks, P, path, group_size=GROUP, seed=0, log=lambda s: None)
    return first, again, credit_recording.read_records(path)


def test_record_resumes_and_stores_labels(recording):
    first, again, records = recording
    assert first["new_groups"] == 6 * len(P) and again["new_groups"] == 0  # resumed: nothing re-recorded
    assert len(records) == 6 * len(P) * GROUP
    assert len({r["group"] for r in records}) == 6 * len(P)
    for r in records:
        assert r["steps"], "every rollout takes at least one step"
        assert all(isinstance(s["subgoals"], list) for s in r["steps"])
        assert r["steps"][-1]["reward"] == (10.0 if r["success"] else 0.0)


def test_expert_policy_follows_the_oracle(recording):
    """p = 0: every labelled step is good and the 4 rollouts of a group are the same episode."""
    records = recording[2]
    expert = [r for r in records if r["p"] == 0.0]
    labels = [s["oracle_good"] for r in expert for s in r["steps"] if s["oracle_good"] is not None]
    assert labels and all(labels)
    by_group: dict[str, set] = {}
    for r in expert:
        by_group.setdefault(r["group"], set()).add(tuple(s["action"] for s in r["steps"]))
    assert all(len(v) == 1 for v in by_group.values())
    rec = cb.Recording.from_records(records)
    summary = {s["subset"]: s for s in cb.recording_summary(rec)}
    assert summary["p=0"]["success_rate"] >= summary["p=1"]["success_rate"]
    assert summary["p=1"]["good_share"] < summary["p=0"]["good_share"] == 1.0


def test_table_has_every_method_with_valid_intervals(recording):
    rec = cb.Recording.from_records(recording[2])
    variants = cb.default_variants("webshop")
    assert {v.name for v in variants} >= {"grpo", "gigpo", "graphgpo", "hgpo", "milegpo", "milegpo-paper",
                                          "milegpo-no-reliability", "milegpo-paper-no-same-state"}
    rows = cb.evaluate(rec.subset(rec.p > 0), variants, n_resamples=200)
    assert [r["method"] for r in rows] == [v.name for v in variants]
    for r in rows:
        assert 0.0 <= r["auc_lo"] <= r["auc"] <= r["auc_hi"] <= 1.0
        assert 0.0 <= r["sign_acc"] <= 1.0
        assert (r["algo"] == "milegpo") == math.isfinite(r["ms_recall"])
    by = {r["method"]: r for r in rows}
    assert by["grpo"]["tie_share"] == 1.0  # GRPO has no step advantage: every same-state pair ties
    assert by["milegpo"]["auc"] > 0.5  # MileGPO's credit points towards the oracle's actions
    md = credit_bench_report.render_markdown({"command": "test", "generated": "now", "resamples": 200, "sweep_resamples": 0,
                             "envs": {"webshop": {"settings": {}, "recording": cb.recording_summary(rec),
                                                  "rows": [{"subset": "all", **r} for r in rows] +
                                                          [{"subset": s, **r} for s in ("p=0", "p=0.5", "p=1")
                                                           for r in rows],
                                                  "pairs": {"all": {"value": 0.1, "low": 0.0, "high": 0.2}}}}})
    assert all(f"| {v.name} |" in md for v in variants) and "nan" not in md


def test_fast_bootstrap_agrees_with_diagnostics():
    rng = np.random.default_rng(0)
    group = np.repeat(np.arange(12), 20)
    good = rng.random(group.size) < 0.4
    known = rng.random(group.size) < 0.9
    scores = np.round(rng.normal(size=group.size) + good, 1)  # rounded: ties occur
    boot = GroupBootstrap(group, good, known, 12, n_resamples=300, seed=0)
    auc = boot.auc(scores)
    assert auc.value == pytest.approx(roc_auc(scores[known], good[known]), abs=1e-12)
    assert auc.low < auc.value < auc.high
    assert boot.sign_accuracy(scores).value == pytest.approx(sign_accuracy(scores[known], good[known]))
    assert boot.auc(good.astype(float)).value == 1.0  # credit equal to the oracle label is perfect
    assert boot.auc(-good.astype(float)).value == 0.0


def test_bad_input():
    with pytest.raises(credit_recording.CreditBenchError, match="p: must be in"):
        credit_recording.record_group(None, None, 1.5, 4, 0)
    with pytest.raises(credit_recording.CreditBenchError, match="no rollouts"):
        cb.evaluate(cb.Recording([], [], [], np.zeros(0), [], 0), cb.default_variants("webshop"))
    with pytest.raises(credit_recording.CreditBenchError, match="group_size"):
        credit_recording.record(None, [], P, "x.jsonl", group_size=1)
    obs = type("O", (), {"oracle_actions": (), "admissible": ()})()
    with pytest.raises(credit_recording.CreditBenchError, match="no admissible"):
        credit_recording.expert_or_random(obs, 0.5, random.Random(0))


def test_formulation_switches_only_on_a_clear_win_everywhere():
    win = {"value": 0.02, "low": 0.01, "high": 0.03}
    unclear = {"value": 0.02, "low": -0.01, "high": 0.05}
    loss = {"value": -0.02, "low": -0.03, "high": -0.01}
    assert credit_bench_report.choose_formulation({"alfworld": win, "webshop": win}, "v3") == "paper"
    assert credit_bench_report.choose_formulation({"alfworld": win, "webshop": unclear}, "v3") == "v3"
    assert credit_bench_report.choose_formulation({"alfworld": loss, "webshop": loss}, "paper") == "v3"
    assert credit_bench_report.choose_formulation({"alfworld": win}, "paper") == "paper"
