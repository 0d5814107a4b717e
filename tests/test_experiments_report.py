"""report and compare on runs written through the real RunStore (evaluations with per-type episodes)."""
import csv
import io
import json

import matplotlib.image as mpimg
import numpy as np
import pytest

from milegpo_cli.errors import RunNotFound
from milegpo_cli.experiments import report as R
from milegpo_cli.experiments import stats as S
from milegpo_cli.experiments.compare import compare
from milegpo_cli.experiments.plots import is_png
from milegpo_cli.store import EpisodeRecord

# final success rate per (algo, split, task type) for seeds 0, 1, 2; two episodes per type
FINAL = {
    ("gigpo", "id", "heat"): [0.5, 0.5, 0.0], ("gigpo", "id", "pick"): [0.5, 1.0, 0.5],
    ("gigpo", "ood", "heat"): [0.0, 0.5, 0.0], ("gigpo", "ood", "pick"): [0.5, 0.5, 0.0],
    ("milegpo", "id", "heat"): [1.0, 0.5, 0.5], ("milegpo", "id", "pick"): [1.0, 1.0, 0.5],
    ("milegpo", "ood", "heat"): [0.5, 0.5, 0.0], ("milegpo", "ood", "pick"): [1.0, 0.5, 0.5],
}


def episodes(split, rates):
    out = []
    for task_type, rate in rates.items():
        wins = int(round(rate * 2))
        out += [EpisodeRecord(task_id=f"{split}/{task_type}/{i}", split=split, task_type=task_type, group=f"e{i}",
                              index=0, outcome=float(i < wins), success=i < wins, length=5) for i in range(2)]
    return out


@pytest.fixture()
def experiment(store):
    exp = store.create_experiment("exp-test", kind="ablate")
    for algo in ("gigpo", "milegpo"):
        for seed in range(3):
            rid = store.create_run(f"{algo}-s{seed}", algo=algo, seed=seed, experiment_id=exp,
                                   config={"env": {"name": "alfworld"}})
            for it in (1, 2):
                store.record_iteration(rid, it, {"steps": 100.0, "time_rollout_s": 2.0, "time_update_s": 1.0})
            for split in ("id", "ood"):
                store.record_evaluation(rid, split, {}, episodes(split, {"heat": 0.0, "pick": 0.0}), iteration=0)
                final = {t: FINAL[algo, split, t][seed] for t in ("heat", "pick")}
                store.record_evaluation(rid, split, {}, episodes(split, final), iteration=2)
            store.set_status(rid, "finished")
    return exp


def hand_bootstrap(strata, seed=0, n_resamples=2000):
    rng = np.random.default_rng(seed)
    res = [np.asarray(s)[rng.integers(0, len(s), (n_resamples, len(s)))] for s in strata]
    return np.quantile(np.concatenate(res, axis=1).mean(axis=1), [0.025, 0.975])


def test_report_counts_means_and_intervals(store, experiment, tmp_path):
    rep = R.build_report(store, experiment, by="algo", baseline="gigpo")
    mile = rep.data["methods"]["milegpo"]
    assert mile["seeds"] == [0, 1, 2] and len(mile["runs"]) == 3
    s_id = mile["metrics"]["success"]["id"]
    assert s_id["n"] == 3 and mile["episodes"] == {"id": [4, 4, 4], "ood": [4, 4, 4]}
    # per seed, success over the 4 episodes of the final evaluation: 1.0, 0.75, 0.5
    per_seed = [np.mean([FINAL["milegpo", "id", t][k] for t in ("heat", "pick")]) for k in range(3)]
    assert s_id["mean"]["value"] == pytest.approx(0.75)
    assert s_id["std"] == pytest.approx(np.std(per_seed, ddof=1))  # over seeds
    lo, hi = hand_bootstrap([per_seed])  # bootstrap over seeds
    assert (s_id["mean"]["low"], s_id["mean"]["high"]) == pytest.approx((lo, hi))
    # the task-type balanced summary (rliable strata) is kept beside it
    lo, hi = hand_bootstrap([FINAL["milegpo", "id", "heat"], FINAL["milegpo", "id", "pick"]])
    by_type = mile["metrics"]["success"]["id_by_type"]
    assert (by_type["mean"]["low"], by_type["mean"]["high"]) == pytest.approx((lo, hi))
    # gap paired by seed: id 1.0, .75, .5 - ood .75, .5, .25
    assert mile["metrics"]["success"]["gap"]["mean"]["value"] == pytest.approx(0.25)
    # P(milegpo > gigpo) on ood: heat 6/9, pick 7/9, averaged over types
    assert mile["metrics"]["success"]["poi_ood"]["value"] == pytest.approx(13 / 18)
    assert rep.data["methods"]["gigpo"]["metrics"]["success"]["poi_ood"] is None  # the baseline itself
    main, extra, per_type, curve, area = rep.tables
    row = next(r for r in main.rows if r[0] == "milegpo")
    assert row[1] == "3" and row[2] == "4, 4" and row[3].startswith("75.0 ± 25.0 [")
    assert "mean ± std over seeds" in main.title and "pooled over task types" in main.title
    assert next(r for r in extra.rows if r[0] == "milegpo")[1].startswith("0.72 [")
    assert len(per_type.rows) == 2 * 2  # methods x task types
    # learning curves: iterations 0 and 2, with the steps trained by then (100 per iteration)
    assert [(r[0], r[1], r[2]) for r in curve.rows] == [("gigpo", "0", "0"), ("gigpo", "2", "200"),
                                                       ("milegpo", "0", "0"), ("milegpo", "2", "200")]
    pts = mile["curves"]["id"]["success"]
    assert [p["mean"]["value"] for p in pts] == pytest.approx([0.0, 0.75])
    # area over iterations 0..2 = (0 + final) / 2: milegpo .5, .375, .25; gigpo .25, .375, .125
    a = mile["area"]["success"]
    assert a["id"]["mean"]["value"] == pytest.approx(0.375)
    vs = a["vs_baseline"]
    assert vs["poi"]["value"] == pytest.approx(7 / 9)  # .5 beats 3, .375 beats 2 ties 1, .25 beats 1 ties 1
    from scipy import stats as sst

    assert vs["poi_p"] == pytest.approx(sst.mannwhitneyu([0.5, 0.375, 0.25], [0.25, 0.375, 0.125]).pvalue)
    assert vs["paired_seeds"] == [0, 1, 2] and vs["difference"]["mean"]["value"] == pytest.approx(0.125)
    t = 4.302652729911275 + 1.0606601717798212  # t_{.975, 2} + t_{.8, 2}
    assert vs["mde"] == pytest.approx(t * np.std([0.25, 0.0, 0.125], ddof=1) / np.sqrt(3))
    assert a["final_vs_baseline"]["difference"]["mean"]["value"] == pytest.approx(0.75 - 0.5)
    assert rep.data["methods"]["gigpo"]["area"]["success"]["vs_baseline"] is None
    row = next(r for r in area.rows if r[0] == "milegpo")
    assert row[:5] == ["milegpo", "success", "3", row[3], "0.78 [" + row[4][6:]] and row[3].startswith("37.5 ± 12.5 [")
    assert row[5] == f"{vs['poi_p']:.3f}"
    assert row[-1] == "-"  # no training steps stored: no credit AUC
    # renderers
    assert json.loads(R.render(rep, "json"))["methods"]["milegpo"]["seeds"] == [0, 1, 2]
    rows = list(csv.reader(io.StringIO(R.render(rep, "csv"))))
    assert rows[1] == main.columns and len([r for r in rows if r and r[0] == "milegpo"]) == 1 + 1 + 2 + 2 + 1
    assert "| milegpo | 3 | 4, 4 |" in R.render(rep, "md")
    assert "<table" in R.render(rep, "html")
    with pytest.raises(R.ExperimentError, match="format"):
        R.render(rep, "xls")
    # plots
    paths = R.plot_report(rep, tmp_path / "plots")
    assert len(paths) == 4  # learning curves and interval bars, id and ood
    for p in paths:
        assert is_png(p) and mpimg.imread(p).shape[2] in (3, 4)


def test_report_grouping_and_errors(store, experiment):
    rep = R.build_report(store, experiment, by="drop")
    assert list(rep.data["methods"]) == ["full"]  # by drop: the milegpo runs only
    assert R.build_report(store).data["methods"].keys() == {"gigpo", "milegpo"}  # all runs of the store
    with pytest.raises(RunNotFound, match="experiment 'nope' not found"):
        R.build_report(store, "nope")
    with pytest.raises(R.ExperimentError, match="baseline"):
        R.build_report(store, experiment, baseline="ppo")
    with pytest.raises(R.ExperimentError, match="by"):
        R.build_report(store, experiment, by="seed")


def test_compare_table_and_curves(store, experiment, tmp_path):
    res = compare(store, [f"exp:{experiment}"], tmp_path / "cmp")
    assert len(res["runs"]) == 6
    first = res["runs"][0]  # gigpo seed 0: final id = (heat 0.5 + pick 0.5) / 2, best is the final
    assert first["id"]["final_success"] == pytest.approx(0.5) and first["id"]["final_iteration"] == 2
    assert first["steps"] == 200 and first["wall_s"] == pytest.approx(6.0) and first["iterations"] == 2
    assert res["plots"] and all(is_png(p) for p in res["plots"])
    assert len(compare(store, ["1", "exp-test"])["runs"]) == 6  # a run id and an experiment name, deduplicated
    with pytest.raises(RunNotFound, match="neither a run nor an experiment"):
        compare(store, ["missing-run"])


def test_report_headline_is_the_pooled_success_runs_show_prints(store):
    """One seed, unequal episodes per task type: the headline is success over the episodes (the
    number `runs show` prints), not the mean over task types; ± is the spread over seeds (0 here)."""
    from milegpo_cli.experiments.runs import show_doc

    rid = store.create_run("one-seed", algo="gigpo", seed=0, config={"env": {"name": "alfworld"}})
    store.record_iteration(rid, 1, {})
    eps = [EpisodeRecord(task_id=f"id/heat/{i}", split="id", task_type="heat", group="e", index=0,
                         outcome=1.0, success=True, length=5) for i in range(1)]
    eps += [EpisodeRecord(task_id=f"id/pick/{i}", split="id", task_type="pick", group="e", index=0,
                          outcome=0.0, success=False, length=5) for i in range(3)]
    store.record_evaluation(rid, "id", {}, eps, iteration=1)
    store.set_status(rid, "finished")
    shown = show_doc(store, rid)["evaluations"][0]["success_rate"]
    rep = R.build_report(store)
    s_id = rep.data["methods"]["gigpo"]["metrics"]["success"]["id"]
    assert s_id["mean"]["value"] == pytest.approx(shown) == pytest.approx(0.25)
    assert rep.data["methods"]["gigpo"]["metrics"]["success"]["id_by_type"]["mean"]["value"] == pytest.approx(0.5)
    row = rep.tables[0].rows[0]
    assert row[:4] == ["gigpo", "1", "4, -", "25.0"]  # one seed: no spread over seeds, no interval over seeds
    per_type = {r[1]: r for r in rep.tables[2].rows}
    assert per_type["heat"][4] == "1, -" and per_type["pick"][4] == "3, -"


def test_report_leaves_unfinished_runs_out(store, experiment):
    """A member still training (its last evaluation is not its final one) is counted, not reported."""
    rid = store.create_run("milegpo-s3", algo="milegpo", seed=3, experiment_id=experiment,
                           config={"env": {"name": "alfworld"}})
    store.record_iteration(rid, 1, {"steps": 100.0})
    store.record_evaluation(rid, "id", {}, episodes("id", {"heat": 1.0, "pick": 1.0}), iteration=0)
    rep = R.build_report(store, experiment)
    assert rep.data["left_out"] == [rid] and rep.data["methods"]["milegpo"]["seeds"] == [0, 1, 2]


def test_report_labels_a_milegpo_formulation(store, experiment):
    """MileGPO runs of another credit.formulation are their own method, not merged into milegpo."""
    rid = store.create_run("paper-s0", algo="milegpo", seed=0, experiment_id=experiment,
                           config={"env": {"name": "alfworld"}, "credit": {"formulation": "paper"}})
    store.record_iteration(rid, 1, {"steps": 100.0})
    store.record_evaluation(rid, "id", {}, episodes("id", {"heat": 1.0, "pick": 1.0}), iteration=1)
    store.set_status(rid, "finished")
    assert set(R.build_report(store, experiment).data["methods"]) == {"gigpo", "milegpo", "milegpo (paper)"}
    assert set(R.build_report(store, experiment, by="drop").data["methods"]) == {"full", "full (paper)"}


def test_report_counts_a_member_trained_by_two_experiments_once(store, experiment):
    """A second experiment of the store that retrains milegpo seed 0 (with a different result here)
    does not add a seed: the earliest run of each method and seed is reported, the other is listed."""
    other = store.create_experiment("exp-two", kind="ablate")
    rid = store.create_run("milegpo-s0-again", algo="milegpo", seed=0, experiment_id=other,
                           config={"env": {"name": "alfworld"}})
    store.record_iteration(rid, 1, {"steps": 100.0})
    for split in ("id", "ood"):
        store.record_evaluation(rid, split, {}, episodes(split, {"heat": 0.0, "pick": 0.0}), iteration=1)
    store.set_status(rid, "finished")
    alone = R.build_report(store, experiment).data["methods"]["milegpo"]["metrics"]["success"]["id"]
    rep = R.build_report(store)
    mile = rep.data["methods"]["milegpo"]
    first = mile["runs"][0]
    assert len(mile["runs"]) == 3 and rid not in mile["runs"] and rep.data["duplicates"] == {rid: first}
    assert mile["metrics"]["success"]["id"] == alone
    assert R.build_report(store, other).data["methods"]["milegpo"]["runs"] == [rid]  # alone, it is reported


def test_graphgpo_under_the_preset_is_its_own_method(store, tmp_path):
    """issue 33: the faithful GraphGPO rows are told apart from those of the old convention."""
    exp = store.create_experiment("exp-graph", kind="ablate")
    for name, preset in (("old", ""), ("faithful", "verl-agent")):
        rid = store.create_run(name, algo="graphgpo", seed=0, experiment_id=exp,
                               config={"env": {"name": "alfworld"}, "credit": {"preset": preset}})
        store.record_iteration(rid, 1, {"steps": 10.0})
        for split in ("id", "ood"):
            store.record_evaluation(rid, split, {}, episodes(split, {"pick": 0.5}), iteration=1)
        store.set_status(rid, "finished")
    rep = R.build_report(store, exp, by="algo")
    assert set(rep.data["methods"]) == {"graphgpo", "graphgpo (verl-agent)"}
    assert {r["method"] for r in compare(store, [f"exp:{exp}"], tmp_path / "cmp")["runs"]} == {
        "graphgpo", "graphgpo (verl-agent)"}


def test_report_states_the_seeds_a_target_mde_needs(store, experiment, tmp_path):
    """`report --mde 2`: each comparison against the baseline says how many paired seeds would bring its
    MDE to 2 points at the spread the pilot shows (area paired differences .25, 0, .125 here)."""
    rep = R.build_report(store, experiment, by="algo", baseline="gigpo", target_mde=0.02)
    vs = rep.data["methods"]["milegpo"]["area"]["success"]["vs_baseline"]
    diffs = [0.25, 0.0, 0.125]
    assert vs["target_mde"] == 0.02 and vs["seeds_needed"] == S.seeds_needed(diffs, 0.02)
    from scipy import stats as sst

    n, s = vs["seeds_needed"], np.std(diffs, ddof=1)
    assert (sst.t.ppf(0.975, n - 1) + sst.t.ppf(0.8, n - 1)) * s / np.sqrt(n) <= 0.02
    area = rep.tables[-1]
    assert "seeds for MDE AUC <= 2" in area.columns
    row = next(r for r in area.rows if r[0] == "milegpo")
    assert row[area.columns.index("seeds for MDE AUC <= 2")] == str(n)
    assert "seeds for MDE AUC <= 2" not in R.build_report(store, experiment, baseline="gigpo").tables[-1].columns
    with pytest.raises(R.ExperimentError, match="mde: must be > 0"):
        R.run_report(store, experiment, "algo", "json", "gigpo", tmp_path, None, mde_points=0)
