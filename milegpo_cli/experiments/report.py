"""Seed and variance tables of an experiment (``milegpo report``).

The headline value of a method on a split is the one ``milegpo runs show`` prints per run: the
success (WebShop also score) over the episodes of the run's final evaluation, pooled over task
types; the table gives its mean ± std over seeds, a 95% bootstrap CI over seeds, the number of seeds
and of episodes per seed, and the ID-to-OOD gap paired by seed. IQM and the probability of
improvement over a baseline are rliable's, over (seed, task type) cells with the task types as
bootstrap strata (ALFWorld's six types, WebShop categories); a per-task-type table gives the
mean ± std over seeds of each type. All numbers come from stored runs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, NamedTuple, Sequence

import numpy as np

from milegpo_cli.experiments import curves, stats
from milegpo_cli.experiments.diagnose import trained_credit_auc
from milegpo_cli.experiments.report_render import FORMATS, SPLITS, Report, Table, plot_report, render, to_rich
from milegpo_cli.experiments.runs import ALL, ExperimentError, RunData, experiment_runs, grid_keys, load_run

BY = ("algo", "drop")
VARIANT_METRICS = ("success_id", "success_ood", "score_id", "score_ood", "auc_id")  # --metric: final value on a split, or area of the id curve
DEFAULT_SWEEP_METRIC = "success_id"


def method_label(run: RunData, by: str) -> str:
    if by == "drop":
        return ("full" if not run.drop else " ".join(f"-{d}" for d in sorted(run.drop))) + run.variant
    return run.method


def _per_seed(runs: Sequence[RunData], split: str, metric: str, task_type: str) -> dict[int, float]:
    out = {}
    for r in runs:
        e = r.final(split, task_type)
        if e is not None:
            out[r.run_id] = float(getattr(e, metric))
    return out


def _episodes(runs: Sequence[RunData], split: str, task_type: str = ALL) -> list[int]:
    """Episodes of each run's final evaluation on ``split`` (runs without one left out)."""
    return [e.episodes for r in runs if (e := r.final(split, task_type)) is not None]


def _per_seed_episodes(counts: Sequence[int]) -> str:
    if not counts:
        return "-"
    return str(counts[0]) if min(counts) == max(counts) else f"{min(counts)}-{max(counts)}"


def _strata(runs: Sequence[RunData], split: str, metric: str, types: Sequence[str]) -> dict[str, dict[int, float]]:
    """task type -> {run id: final value}; the whole split as one stratum when no type is stored."""
    strata = {t: _per_seed(runs, split, metric, t) for t in types}
    strata = {t: v for t, v in strata.items() if v}
    return strata or {ALL: v for v in [_per_seed(runs, split, metric, ALL)] if v}


def _fmt(est: stats.Estimate | None, scale: float) -> str:
    if est is None:
        return "-"
    return stats.format_interval(est.value, est.low, est.high, 1, scale)


def _fmt_summary(s: stats.Summary | None, scale: float = 100.0, spread: bool = True) -> str:
    """mean ± std [CI] (``spread`` False: mean [CI]); one seed has neither: its value alone."""
    if s is None:
        return "-"
    if s.n < 2:
        return f"{s.mean.value * scale:.1f}"
    std = f" ± {s.std * scale:.1f}" if spread else ""
    return f"{s.mean.value * scale:.1f}{std} [{s.mean.low * scale:.1f}, {s.mean.high * scale:.1f}]"


def _summary(strata: dict[str, dict[int, float]], seed: int) -> stats.Summary | None:
    vals = [list(v.values()) for v in strata.values() if v]
    return stats.summarize(vals, seed=seed) if vals else None


def _gap(id_s: dict[str, dict[int, float]], ood_s: dict[str, dict[int, float]], seed: int) -> stats.Summary | None:
    """ID - OOD paired by seed within each stratum both splits have (the whole split: ALL)."""
    pairs = []
    for t in sorted(set(id_s) & set(ood_s)):
        common = sorted(set(id_s[t]) & set(ood_s[t]))
        if common:
            pairs.append(([id_s[t][r] for r in common], [ood_s[t][r] for r in common]))
    if not pairs:
        return None
    return stats.gap([p[0] for p in pairs], [p[1] for p in pairs], seed=seed)


def _improvement_probability(x: dict[str, dict[int, float]], y: dict[str, dict[int, float]], seed: int) -> stats.Estimate | None:
    common = [t for t in sorted(set(x) & set(y)) if x[t] and y[t]]
    if not common:
        return None
    return stats.probability_of_improvement(
        [list(x[t].values()) for t in common], [list(y[t].values()) for t in common], seed=seed)


def _by_seed(runs: Sequence[RunData], value) -> dict[int, float]:
    """seed -> value(run) for the runs where it is defined."""
    return {r.seed: v for r in runs if (v := value(r)) is not None}


def _versus(x: dict[int, float], y: dict[int, float], seed: int, target_mde: float | None = None) -> dict:
    """x against baseline y over seeds: P(X > Y), the difference paired by seed, its MDE and, for a
    ``target_mde``, the number of paired seeds whose MDE would reach it at the observed spread."""
    common = sorted(set(x) & set(y))
    diffs = [x[k] - y[k] for k in common]
    return {"poi": stats.probability_of_improvement([list(x.values())], [list(y.values())], seed=seed).to_dict()
            if x and y else None,
            "poi_p": stats.improvement_p_value(list(x.values()), list(y.values())) if x and y else None,
            "paired_seeds": common,
            "difference": stats.summarize(diffs, seed=seed).to_dict() if diffs else None,
            "mde": stats.minimum_detectable_difference(diffs) if len(diffs) > 1 else None,
            "target_mde": target_mde,
            "seeds_needed": stats.seeds_needed(diffs, target_mde) if target_mde and len(diffs) > 1 else None}


def _fmt_dict(e: dict | None, scale: float = 100.0, digits: int = 1) -> str:
    return "-" if e is None else stats.format_interval(e["value"], e["low"], e["high"], digits, scale)


def _versus_cells(vs: dict | None) -> list[str]:
    """Cells of a ``_versus`` result: P(X > Y) [CI], its p-value, the paired difference [CI], its MDE."""
    if vs is None:
        return ["-"] * 4
    return [_fmt_dict(vs["poi"], 1.0, 2), "-" if vs["poi_p"] is None else f"{vs['poi_p']:.3f}",
            _fmt_dict(vs["difference"] and vs["difference"]["mean"]),
            "-" if vs["mde"] is None else f"{100 * vs['mde']:.1f}"]


def _curve_table(groups: dict[str, list[RunData]], data: dict, metrics: Sequence[str], title: str, seed: int) -> Table:
    """Each method's evaluation at every iteration its runs share; fills ``data["methods"][m]["curves"]``."""
    rows = []
    for m, rs in groups.items():
        pts = {(s, met): {p.iteration: p for p in curves.common_curve(rs, s, met, seed)} for s in SPLITS for met in metrics}
        data["methods"][m]["curves"] = {s: {met: [p.to_dict() for p in pts[s, met].values()] for met in metrics}
                                        for s in SPLITS}
        for it, p in pts["id", metrics[0]].items():
            rows.append([m, str(it), f"{p.steps:.0f}"] + [_fmt_summary(q.summary, spread=False) if (q := pts[s, met].get(it))
                                                          else "-" for met in metrics for s in SPLITS])
    return Table(f"{title}: learning curves, % at each evaluated iteration (0: the starting policy); mean [95% CI] "
                 "over seeds; steps: mean environment steps trained by then",
                 ["method", "iteration", "steps"] + [f"{met} {s}" for met in metrics for s in SPLITS], rows)


def _seeds_needed_cell(vs: dict | None) -> str:
    """Seeds whose MDE would reach the target (``_versus``): a number, "> 1000" or "-"."""
    if vs is None or vs["mde"] is None:
        return "-"
    return "> 1000" if vs["seeds_needed"] is None else str(vs["seeds_needed"])


def _area_table(groups: dict[str, list[RunData]], data: dict, metrics: Sequence[str], baseline: str | None,
                credit: Mapping[int, float], title: str, seed: int, target_mde: float | None = None) -> Table:
    """The area under each method's id curve, against the baseline with the power of the comparison
    (and the seeds a ``target_mde`` needs), and its credit AUC; fills ``data["methods"][m]["area" / "credit_auc"]``."""
    def by_method(value) -> dict[str, dict[str, dict[int, float]]]:
        return {m: {met: _by_seed(rs, lambda r, met=met: value(r, met)) for met in metrics} for m, rs in groups.items()}

    areas = by_method(lambda r, met: curves.area(r, "id", met))
    finals = by_method(lambda r, met: getattr(r.final("id"), met, None))
    rows = []
    for m, rs in groups.items():
        d = data["methods"][m]
        cr = _by_seed(rs, lambda r: credit.get(r.run_id))
        d["credit_auc"] = stats.summarize(list(cr.values()), seed=seed).to_dict() if cr else None
        d["area"] = {}
        for met in metrics:
            a = areas[m][met]
            vs = (_versus(a, areas[baseline][met], seed, target_mde),
                  _versus(finals[m][met], finals[baseline][met], seed, target_mde)) \
                if baseline and m != baseline else (None, None)
            summary = _summary({ALL: a}, seed) if a else None
            d["area"][met] = {"id": summary and summary.to_dict(), "vs_baseline": vs[0], "final_vs_baseline": vs[1]}
            rows.append([m, met, str(len(a)), _fmt_summary(summary)]
                        + ((_versus_cells(vs[0]) + ([_seeds_needed_cell(vs[0])] if target_mde else [])
                            + _versus_cells(vs[1])[2:]) if baseline else [])
                        + [_fmt_dict(d["credit_auc"] and d["credit_auc"]["mean"], 1.0, 3)
                           + (f" ({len(cr)} of {len(a)} seeds)" if cr and len(cr) < len(a) else "")])
    cols = ["method", "metric", "seeds", "AUC id"]
    if baseline:
        cols += [f"P(AUC id > {baseline})", "p (Mann-Whitney)", f"AUC id - {baseline}", "MDE AUC"]
        cols += [f"seeds for MDE AUC <= {100 * target_mde:g}"] if target_mde else []
        cols += [f"final id - {baseline}", "MDE final"]
    versus = (f"; against {baseline}: probability of improvement over seeds with the two-sided Mann-Whitney p of "
              "P = 0.5, and differences paired by seed with the minimum detectable difference MDE (80% power, 5% "
              "level, from the observed spread)" + (f" and the paired seeds at which that MDE would reach "
              f"{100 * target_mde:g} points at the same spread" if target_mde else "")) if baseline else ""
    return Table(f"{title}: area under the id learning curve over iterations (its mean height, %), mean ± std "
                 f"[95% CI] over seeds{versus}; credit AUC: ROC-AUC of the trained advantages against the oracle "
                 "labels, mean [95% CI] over seeds", cols + ["credit AUC"], rows)


def metric_value(run: RunData, metric: str) -> float | None:
    """A run's value of a ``VARIANT_METRICS`` metric (None: not evaluated)."""
    if metric == "auc_id":
        return curves.area(run, "id", "success")
    met, split = metric.rsplit("_", 1)
    e = run.final(split)
    return None if e is None else float(getattr(e, met))


def variants_table(groups: dict[str, list[RunData]], data: dict, metric: str, title: str, seed: int) -> Table:
    """The variants ranked by the mean of ``metric`` over seeds (mean ± std [CI], IQM [CI]), and the best
    one against each other: P(best > variant), its Mann-Whitney p, the difference paired by seed and
    its MDE; fills ``data["variants"]``."""
    if metric not in VARIANT_METRICS:
        raise ExperimentError(f"metric: must be one of {', '.join(VARIANT_METRICS)}, got {metric!r}")
    by = {m: v for m, rs in groups.items() if (v := _by_seed(rs, lambda r: metric_value(r, metric)))}
    if not by:
        raise ExperimentError(f"metric: no reported run has {metric}")
    means = {m: float(np.mean(list(v.values()))) for m, v in by.items()}
    best = max(means, key=lambda m: (means[m], m))
    data["variants"] = {"metric": metric, "best": best, "variants": {}}
    rows = []
    for m in sorted(means, key=lambda m: -means[m]):
        s = stats.summarize(list(by[m].values()), seed=seed)
        vs = None if m == best else _versus(by[best], by[m], seed)
        data["variants"]["variants"][m] = {"seeds": sorted(by[m]), "summary": s.to_dict(), "best_vs_this": vs}
        rows.append([m + (" (best)" if m == best else ""), str(s.n), _fmt_summary(s), _fmt(s.iqm, 100.0)]
                    + _versus_cells(vs))
    return Table(f"{title}: variants by {metric} (%), mean ± std [95% CI] and IQM [95% CI] over seeds; the best "
                 "against each other: probability of improvement with its Mann-Whitney p, difference paired by "
                 "seed [95% CI] and its minimum detectable difference",
                 ["variant", "seeds", metric, f"IQM {metric}", "P(best > variant)", "p (Mann-Whitney)",
                  "best - variant", "MDE"], rows)


class Covered(NamedTuple):
    runs: list[RunData]  # what the report counts
    left_out: list[int]  # unfinished runs
    duplicates: dict[int, int]  # run id -> the run of the same method and seed that is counted instead


def reported_runs(runs: Sequence[RunData], by: str) -> Covered:
    """The runs a report covers: finished and evaluated (milegpo only with ``by`` drop), one per method
    and seed, the earliest; a store where two experiments trained the same member (a method and seed
    shared by both) counts it once, as a paired comparison needs."""
    if by not in BY:
        raise ExperimentError(f"by: must be one of {', '.join(BY)}, got {by!r}")
    if by == "drop":
        runs = [r for r in runs if r.algo == "milegpo"]
    first: dict[tuple[str, int], int] = {}
    kept, duplicates = [], {}
    for r in sorted((r for r in runs if r.evals and r.status == "finished"), key=lambda r: r.run_id):
        key = (method_label(r, by), r.seed)
        if key in first:
            duplicates[r.run_id] = first[key]
        else:
            first[key] = r.run_id
            kept.append(r)
    if not kept:
        raise ExperimentError("report: no finished evaluated runs to report on"
                              + (" (by=drop needs milegpo runs)" if by == "drop" else ""))
    return Covered(kept, [r.run_id for r in runs if r.status != "finished"], duplicates)


def report_from_runs(
    runs: Sequence[RunData], *, by: str = "algo", baseline: str | None = None, title: str = "report", seed: int = 0,
    credit: Mapping[int, float] | None = None, metric: str | None = None, target_mde: float | None = None,
) -> Report:
    """Build the tables from plain run views (pure; ``build_report`` loads them from the store).

    ``credit``: run id -> credit ROC-AUC of its trained advantages (runs without one show "-").
    ``metric``: also rank the methods by it (``variants_table``).
    ``target_mde``: a difference (a fraction, 0.02 = 2 points) for which each comparison against the
    baseline states the paired seeds its MDE needs at the observed spread.
    """
    runs, left_out, duplicates = reported_runs(runs, by)
    groups: dict[str, list[RunData]] = {}
    for r in sorted(runs, key=lambda r: (r.algo, r.drop, r.seed, r.run_id)):
        groups.setdefault(method_label(r, by), []).append(r)
    if baseline is None:
        baseline = next((b for b in (("full",) if by == "drop" else ("gigpo", "grpo")) if b in groups), None)
    elif baseline not in groups:
        raise ExperimentError(f"baseline: {baseline!r} is not among the methods {', '.join(groups)}")
    envs = {r.env for r in runs}
    metrics = ("success", "score") if "webshop" in envs else ("success",)
    types = sorted({t for r in runs for s in SPLITS for t in r.task_types(s)})

    data: dict = {"title": title, "by": by, "baseline": baseline, "metrics": list(metrics), "methods": {},
                  "left_out": left_out, "duplicates": duplicates}
    strata = {m: {(split, met): _strata(rs, split, met, types) for split in SPLITS for met in metrics}
              for m, rs in groups.items()}
    main_cols = ["method", "seeds", "episodes"]
    for met in metrics:
        main_cols += [f"{met} id", f"{met} ood", f"{met} gap"]
    extra_cols = ["method"] + ([f"P({met} ood > {baseline})" for met in metrics] if baseline else [])
    extra_cols += [f"IQM {metrics[0]} ood", "steps", "wall s"]
    main_rows, extra_rows, type_rows = [], [], []
    for m, rs in groups.items():
        d: dict = {"runs": [r.run_id for r in rs], "seeds": sorted({r.seed for r in rs}), "metrics": {},
                   "episodes": {s: _episodes(rs, s) for s in SPLITS}}
        row = [m, str(len(rs)), ", ".join(_per_seed_episodes(d["episodes"][s]) for s in SPLITS)]
        for met in metrics:
            pooled = {s: _per_seed(rs, s, met, ALL) for s in SPLITS}
            s_id, s_ood = (_summary({ALL: pooled[s]}, seed) for s in SPLITS)
            g = _gap({ALL: pooled["id"]}, {ALL: pooled["ood"]}, seed)
            by_type = {s: _summary(strata[m][s, met], seed) for s in SPLITS}
            d["metrics"][met] = {"id": s_id and s_id.to_dict(), "ood": s_ood and s_ood.to_dict(), "gap": g and g.to_dict(),
                                 "id_by_type": by_type["id"] and by_type["id"].to_dict(),
                                 "ood_by_type": by_type["ood"] and by_type["ood"].to_dict()}
            row += [_fmt_summary(s_id), _fmt_summary(s_ood), _fmt_summary(g, spread=False)]
        main_rows.append(row)
        row = [m]
        if baseline:
            for met in metrics:
                p = None if m == baseline else _improvement_probability(strata[m]["ood", met], strata[baseline]["ood", met], seed)
                pi = None if m == baseline else _improvement_probability(strata[m]["id", met], strata[baseline]["id", met], seed)
                d["metrics"][met]["poi_ood"] = p and p.to_dict()
                d["metrics"][met]["poi_id"] = pi and pi.to_dict()
                row.append("-" if p is None else stats.format_interval(p.value, p.low, p.high))
        s_ood = _summary(strata[m]["ood", metrics[0]], seed)  # over (seed, task type) cells
        row += [_fmt(s_ood.iqm if s_ood else None, 100.0), f"{sum(r.steps for r in rs) / len(rs):.0f}",
                f"{sum(r.wall_s for r in rs) / len(rs):.0f}"]
        extra_rows.append(row)
        d["types"] = {}
        for t in types:
            d["types"][t] = {}
            for met in metrics:
                by_split = {s: {t: v} for s in SPLITS if (v := strata[m][s, met].get(t))}
                s_id = _summary(by_split.get("id", {}), seed)
                s_ood = _summary(by_split.get("ood", {}), seed)
                g = _gap(by_split.get("id", {}), by_split.get("ood", {}), seed)
                d["types"][t][met] = {"id": s_id and s_id.to_dict(), "ood": s_ood and s_ood.to_dict(), "gap": g and g.to_dict()}
                n = max((len(v[t]) for v in by_split.values()), default=0)
                eps = ", ".join(_per_seed_episodes(_episodes(rs, s, t)) for s in SPLITS)
                type_rows.append([m, t, met, str(n), eps, _fmt_summary(s_id), _fmt_summary(s_ood),
                                  _fmt_summary(g, spread=False)])
        data["methods"][m] = d
    tables = [Table(f"{title}: final evaluation, % of its episodes (pooled over task types, as `runs show`); "
                    "mean ± std over seeds [95% bootstrap CI over seeds]; episodes per seed (id, ood); "
                    "gap id - ood paired by seed",
                    main_cols, main_rows),
              Table(f"{title}: " + (f"probability of improvement over {baseline}, " if baseline else "")
                    + "IQM [95% CI] over (seed, task type) cells (rliable); mean environment steps and wall time "
                    "per run", extra_cols, extra_rows)]
    if types:
        tables.append(Table(f"{title}: per task type, % of its episodes; mean ± std over seeds [95% CI]; "
                            "episodes per seed (id, ood)",
                            ["method", "task type", "metric", "seeds", "episodes", "id", "ood", "gap"],
                            type_rows))
    if metric is not None:
        tables.insert(0, variants_table(groups, data, metric, title, seed))
    tables += [_curve_table(groups, data, metrics, title, seed),
               _area_table(groups, data, metrics, baseline, credit or {}, title, seed, target_mde)]
    return Report(title=title, by=by, baseline=baseline, metrics=metrics, data=data, tables=tables)


def build_report(store, experiment: int | str | None = None, by: str = "algo", baseline: str | None = None,
                 metric: str | None = None, target_mde: float | None = None) -> Report:
    """The report of an experiment's runs (default: every run in the store); a sweep's (or with
    ``metric``) ranks its variants by ``metric`` (default ``success_id``)."""
    if experiment is None:
        runs = [load_run(store, r["id"]) for r in store.list_runs()]
        title, exp = "all runs", None
    else:
        exp, runs = experiment_runs(store, experiment)
        title = f"experiment {exp['id']} ({exp['name']})"
    credit = {r.run_id: auc for r in reported_runs(runs, by).runs  # the runs the report covers, not all of the store
              if (auc := trained_credit_auc(store, r.run_id)) is not None}
    if metric is None and exp is not None and grid_keys(exp):
        metric = DEFAULT_SWEEP_METRIC
    report = report_from_runs(runs, by=by, baseline=baseline, title=title, credit=credit, metric=metric,
                              target_mde=target_mde)
    report.data["root"] = runs[0].root
    report.data["experiment"] = None if exp is None else {"id": exp["id"], "name": exp["name"],
                                                          "mlflow_run_id": exp["mlflow_run_id"]}
    return report


def log_plots(store, report: Report) -> str | None:
    """Log the report's plots to the experiment's MLflow parent run; returns that run id (or None)."""
    from milegpo_cli.store.tracking import Tracker

    exp = report.data.get("experiment")
    if not exp or not exp["mlflow_run_id"] or not report.plots:
        return None
    runs = store.list_runs(exp["id"])
    uri = next(((r["config"].get("store") or {}).get("mlflow_uri") for r in runs if r["config"]), None)
    if not uri:
        return None
    tracker = Tracker(uri)
    tracker.run_id = exp["mlflow_run_id"]
    for p in report.plots:
        tracker.log_artifact(p, "report")
    return exp["mlflow_run_id"]


def run_report(store, experiment: int | str | None, by: str, fmt: str, baseline: str | None,
               out_dir: str | Path | None, console, metric: str | None = None, mde_points: float | None = None) -> Report:
    """``milegpo report``: print the tables in ``fmt``; plots to ``out_dir`` (default
    ``<store root>/report/<experiment id or 'all'>``), logged to the experiment's MLflow parent run."""
    if fmt not in FORMATS:
        raise ExperimentError(f"format: must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if mde_points is not None and not mde_points > 0:
        raise ExperimentError(f"mde: must be > 0 points of success, got {mde_points:g}")
    report = build_report(store, experiment, by, baseline, metric, None if mde_points is None else mde_points / 100)
    exp = report.data["experiment"]
    plot_report(report, out_dir or Path(report.data["root"]) / "report" / (str(exp["id"]) if exp else "all"))
    log_plots(store, report)
    if fmt == "table":
        for t in to_rich(report.tables):
            console.print(t)
        console.print("plots: " + ", ".join(report.plots))
    else:
        console.out(render(report, fmt), highlight=False)
    return report
