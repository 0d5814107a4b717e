"""ablate end to end on a tiny WebShop recipe, then report / compare / diagnose on what it stored."""
from __future__ import annotations

import json
import os

import pytest
import torch
from rich.console import Console

from milegpo_cli.config import load_config
from milegpo_cli.experiments.ablate import members, run_ablate, seed_major
from milegpo_cli.experiments.compare import compare
from milegpo_cli.experiments.diagnose import diagnose
from milegpo_cli.experiments.report import build_report, log_plots, plot_report
from milegpo_cli.experiments.runs import ExperimentError
from milegpo_cli.store import RunStore
from conftest import TINY_MODEL

torch.set_num_threads(1)

TINY = [*TINY_MODEL,
        "rollout.groups=2", "rollout.group_size=4", "ppo.epochs=1",
        "eval.episodes=4", "eval.every=1", "checkpoint.every=1", "run.iterations=1", "run.threads=1",
        "env.max_steps=4", "env.webshop.num_products=300", "env.webshop.train_instructions=40", "rollout.train_tasks=16",
        "env.webshop.eval_instructions=8", "base.enabled=false", "eval.probe_states=6"]


def quiet() -> Console:
    return Console(file=open(os.devnull, "w"), width=120)


def test_members_spec():
    config = load_config("webshop", TINY)
    ms = members(config, None, 2, ["grpo"])
    labels = [m.label for m in ms]
    assert labels == ["milegpo s0", "milegpo s1", "milegpo -reliability s0", "milegpo -reliability s1",
                      "milegpo -progress s0", "milegpo -progress s1", "milegpo -same-state s0",
                      "milegpo -same-state s1", "grpo s0", "grpo s1"]
    assert [m.label for m in members(config, [], 2, ["grpo"])] == ["milegpo s0", "milegpo s1", "grpo s0", "grpo s1"]
    plan = [(m, i) for i, m in enumerate(members(config, [], 2, ["grpo"]))]
    assert [m.label for m, _ in seed_major(plan)] == ["milegpo s0", "grpo s0", "milegpo s1", "grpo s1"]
    with pytest.raises(ExperimentError, match="drop"):
        members(config, ["speed"], 1)
    with pytest.raises(ExperimentError, match="algos"):
        members(config, None, 1, ["ppo"])


@pytest.mark.slow
def test_ablate_resumes_and_reports(tmp_path):
    config = load_config("webshop", [*TINY, f"store.root={json.dumps(str(tmp_path))}"])
    store = RunStore(config.store.db)
    exp_id = run_ablate(config, store, config.store.mlflow_uri, ["reliability"], 1, quiet(), algos=["grpo"])
    runs = store.list_runs(exp_id)
    assert sorted((r["algo"], tuple(r["drop"])) for r in runs) == [
        ("grpo", ()), ("milegpo", ()), ("milegpo", ("reliability",))]
    assert all(r["status"] == "finished" and r["iterations"] == 1 for r in runs)

    # MLflow: one parent run, the members are its children
    from mlflow.tracking import MlflowClient

    client = MlflowClient(config.store.mlflow_uri)
    parent = store.get_experiment(exp_id)["mlflow_run_id"]
    for r in runs:
        tags = client.get_run(r["mlflow_run_id"]).data.tags
        assert tags["mlflow.parentRunId"] == parent and tags["milegpo.experiment_id"] == str(exp_id)

    # resumable: a finished experiment trains nothing again; an unfinished member is resumed in place
    store.set_status(runs[0]["id"], "failed")  # resumed in a `milegpo train --resume` subprocess
    assert run_ablate(config, store, config.store.mlflow_uri, ["reliability"], 1, quiet(), algos=["grpo"],
                      parallel=2) == exp_id
    again = store.list_runs(exp_id)
    assert [r["id"] for r in again] == [r["id"] for r in runs]
    assert all(r["status"] == "finished" and r["iterations"] == 1 for r in again)

    rep = build_report(store, exp_id, by="algo")
    assert set(rep.data["methods"]) == {"grpo", "milegpo", "milegpo -reliability"}
    assert rep.metrics == ("success", "score")  # WebShop: score and success
    assert all(m["metrics"]["score"]["ood"]["n"] == 1 for m in rep.data["methods"].values())
    # WebShop's OOD categories differ from ID ones: the gap pairs whole-split values by seed
    assert all(m["metrics"]["success"]["gap"]["n"] == 1 for m in rep.data["methods"].values())
    plot_report(rep, tmp_path / "rep")
    assert log_plots(store, rep) == parent
    assert {a.path for a in client.list_artifacts(parent, "report")} >= {"report/report_success_ood.png"}
    assert len(compare(store, [f"exp:{exp_id}"], tmp_path / "cmp")["runs"]) == 3
    d = diagnose(store, runs[1]["id"], n_resamples=50)
    assert d["labelled_steps"] > 0 and len(d["credit"]) == 1 + 8


def test_gigpo_baseline_rows_use_the_verl_agent_preset():
    from milegpo_cli.config import load_config
    from milegpo_cli.experiments.ablate import Member, member_config

    config = load_config("webshop")
    assert member_config(config, Member("gigpo", (), 0)).credit.preset == "verl-agent"
    assert member_config(config, Member("milegpo", ("traps",), 1)).credit.preset == ""
    chosen = load_config("webshop", ['credit.preset=""', "run.algo=gigpo"])
    assert member_config(chosen, Member("gigpo", (), 0)).credit.preset == ""  # the method itself, as configured


def test_graphgpo_and_hgpo_baseline_rows_run_their_recipes():
    """The public recipes' settings per environment (run_qwen2.5_1.5b_*_train.sh): GraphGPO gamma_G 0.1 on
    ALFWorld and 0.2 on WebShop, mean_std_norm on both; HGPO mean_std_norm on ALFWorld and mean_norm on WebShop."""
    from milegpo_cli.config import load_config
    from milegpo_cli.experiments.ablate import Member, member_config

    for env, gamma_g, hgpo_norm in (("alfworld", 0.1, "mean_std"), ("webshop", 0.2, "mean")):
        config = load_config(env)
        graph = member_config(config, Member("graphgpo", (), 0)).credit
        assert (graph.preset, graph.graph_gamma, graph.graph_final, graph.graph_unreachable, graph.graph_invalid,
                graph.step_norm) == ("verl-agent", gamma_g, "observed", "farthest", True, "mean_std")
        hgpo = member_config(config, Member("hgpo", (), 0)).credit
        assert (hgpo.preset, hgpo.step_norm, hgpo.hgpo_history, hgpo.anchor_visits) == ("verl-agent", hgpo_norm, 2, False)


def test_more_seeds_extend_the_experiment_without_retraining(tmp_path):
    """`--seeds 2` after `--seeds 1`: the same experiment, seed 0's run kept as it was (same id, not
    trained again), seed 1 registered and trained; `--seeds 1` again trains nothing and keeps both."""
    config = load_config("webshop", [*TINY, f"store.root={json.dumps(str(tmp_path))}"])
    store = RunStore(config.store.db)
    exp_id = run_ablate(config, store, None, [], 1, quiet())
    [first] = store.list_runs(exp_id)
    first_iterations = store.iterations(first["id"])
    assert run_ablate(config, store, None, [], 2, quiet()) == exp_id
    runs = sorted(store.list_runs(exp_id), key=lambda r: r["seed"])
    assert [(r["id"], r["seed"], r["status"]) for r in runs] == [(first["id"], 0, "finished"), (runs[1]["id"], 1, "finished")]
    assert store.iterations(first["id"]) == first_iterations  # seed 0 not trained again
    assert run_ablate(config, store, None, [], 1, quiet()) == exp_id
    assert len(store.list_runs(exp_id)) == 2
    assert len(store.list_experiments()) == 1


@pytest.mark.slow
def test_a_results_only_copy_resumes_the_experiment_elsewhere(tmp_path):
    """`runs backup --results-only` of an experiment with a run left unfinished: the copy holds the finished
    runs' evaluations and iterations as they were, no steps, training episodes, candidates or checkpoints,
    and not the unfinished run; the same ablate with more seeds in a fresh folder around the copy resumes
    that experiment, keeps the finished runs (same ids, not trained again) and trains the rest."""
    from milegpo_cli.experiments.ablate import Member, member_config
    from milegpo_cli.store.backup import backup_sqlite

    here, there = tmp_path / "here", tmp_path / "there"
    config = load_config("webshop", [*TINY, f"store.root={json.dumps(str(here))}"])
    store = RunStore(config.store.db)
    exp_id = run_ablate(config, store, config.store.mlflow_uri, [], 1, quiet(), algos=["grpo"])
    finished = {r["id"]: r for r in store.list_runs(exp_id)}
    cut = member_config(config, Member("milegpo", (), 1))  # a seed-1 member a kill left unfinished
    store.create_run(name="cut", algo="milegpo", seed=1, config=cut.to_dict(), experiment_id=exp_id)
    assert all(store.steps(rid) and store.episodes(rid) and store.checkpoints(rid) for rid in finished)

    there.mkdir()
    backup_sqlite(store.url, there / "milegpo.db", results_only=True)
    backup_sqlite(store.url, tmp_path / "whole.db")
    assert (there / "milegpo.db").stat().st_size < (tmp_path / "whole.db").stat().st_size
    copy = RunStore(there / "milegpo.db")
    assert {r["id"] for r in copy.list_runs(exp_id)} == set(finished)
    for rid in finished:
        evaluations = store.evaluations(rid)
        assert copy.evaluations(rid) == evaluations and copy.iterations(rid) == store.iterations(rid)
        for ev in evaluations:
            kept = store.episodes(rid, evaluation_id=ev["id"])
            assert copy.episodes(rid, evaluation_id=ev["id"]) == [{**e, "final_state": None} for e in kept]
        assert not (copy.steps(rid) or copy.episodes(rid) or copy.checkpoints(rid) or copy.candidates(rid))
        assert copy.get_run(rid)["mlflow_run_id"] is None
    whole, kept = build_report(store, exp_id, by="algo"), build_report(copy, exp_id, by="algo")
    for method, d in kept.data["methods"].items():  # all but the credit AUC: it needs the training steps
        assert d["credit_auc"] is None and whole.data["methods"][method]["credit_auc"] is not None
        assert {**d, "credit_auc": None} == {**whole.data["methods"][method], "credit_auc": None}

    moved = load_config("webshop", [*TINY, f"store.root={json.dumps(str(there))}"])
    out = Console(record=True, width=200)
    assert run_ablate(moved, copy, moved.store.mlflow_uri, [], 2, out, algos=["grpo"]) == exp_id
    printed = out.export_text()
    assert f"resuming experiment {exp_id}" in printed and "2 finished, 2 to train" in printed
    runs = copy.list_runs(exp_id)
    assert sorted((r["algo"], r["seed"], r["status"]) for r in runs) == [
        ("grpo", 0, "finished"), ("grpo", 1, "finished"), ("milegpo", 0, "finished"), ("milegpo", 1, "finished")]
    assert all(copy.iterations(rid) == store.iterations(rid) for rid in finished)  # not trained again
    assert copy.get_experiment(exp_id)["mlflow_run_id"]  # a new parent run in the new MLflow store
    from milegpo_cli.experiments.report_render import render
    assert "seeds) |" not in render(whole, "md")
    assert render(build_report(copy, exp_id, by="algo"), "md").count("(1 of 2 seeds) |") == 4  # 2 methods x 2 metrics


def test_a_member_on_another_testbed_is_refused(tmp_path):
    """Finished runs record their testbed; when a finished run of the experiment recorded other evaluation games under
    the same label (trained on another machine), the next member stops before it evaluates anything, in one
    line naming both digests; another label (other lists by design, as in a sweep) is not compared."""
    config = load_config("webshop", [*TINY, f"store.root={json.dumps(str(tmp_path))}"])
    store = RunStore(config.store.db)
    exp_id = run_ablate(config, store, None, [], 1, quiet())
    [first] = store.list_runs(exp_id)
    mine = first["versions"]["testbed_games"]
    label, digest = mine.split("/")
    assert len(digest) == 16 and "testbed_base" not in first["versions"]  # TINY starts from no base policy
    store.set_status(first["id"], "finished", versions={"testbed_games": f"{label}/{'0' * 16}"})
    out = Console(record=True, width=400)
    with pytest.raises(ExperimentError, match="1 member"):
        run_ablate(config, store, None, [], 2, out)
    assert f"testbed_games {mine} here, {label}/{'0' * 16} there" in out.export_text()
    [second] = [r for r in store.list_runs(exp_id) if r["seed"] == 1]
    assert second["status"] == "failed" and not store.evaluations(second["id"])
    store.set_status(first["id"], "finished", versions={"testbed_games": f"another/{digest}"})
    run_ablate(config, store, None, [], 2, quiet())
    assert [r["status"] for r in store.list_runs(exp_id)] == ["finished", "finished"]
    assert store.get_run(second["id"])["versions"]["testbed_games"] == mine  # seed 1's lists: seed 0's


def test_more_variants_extend_the_experiment_without_retraining(tmp_path):
    """Ablations added to a baselines-only experiment of the same base config: the same experiment, the
    full method's run kept as it was (same id, not trained again), the new variant trained and listed
    in the stored spec; a different base config is another experiment."""
    config = load_config("webshop", [*TINY, f"store.root={json.dumps(str(tmp_path))}"])
    store = RunStore(config.store.db)
    exp_id = run_ablate(config, store, None, [], 1, quiet(), algos=["grpo"])
    before = {(r["algo"], tuple(r["drop"])): r["id"] for r in store.list_runs(exp_id)}
    first_iterations = store.iterations(before[("milegpo", ())])
    out = Console(record=True, width=200)
    assert run_ablate(config, store, None, ["traps"], 1, out, algos=["grpo"]) == exp_id
    printed = out.export_text()
    assert f"extending experiment {exp_id}" in printed and "with milegpo -traps\n2 finished, 1 to train" in printed
    runs = {(r["algo"], tuple(r["drop"])): r for r in store.list_runs(exp_id)}
    assert sorted(runs) == [("grpo", ()), ("milegpo", ()), ("milegpo", ("traps",))]
    assert {k: runs[k]["id"] for k in before} == before
    assert all(r["status"] == "finished" for r in runs.values())
    assert store.iterations(before[("milegpo", ())]) == first_iterations  # not trained again
    assert store.get_experiment(exp_id)["config"]["variants"] == [["milegpo", []], ["grpo", []], ["milegpo", ["traps"]]]
    other = load_config("webshop", [*TINY, f"store.root={json.dumps(str(tmp_path))}", "ppo.lr=1e-4"])
    assert run_ablate(other, store, None, [], 1, quiet()) != exp_id
    assert len(store.list_experiments()) == 2
