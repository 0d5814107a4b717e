"""``milegpo diagnose RUN``: milestones and traps, their evolution, credit diagnostics, a rollout graph.

Everything is read from the store: the run's training episodes and steps (state keys, actions,
rewards, outcomes, oracle labels, true subgoals), its candidate sets, its resolved config. The
credit diagnostics are computed for the advantages the run trained with ("stored") and, on the
same stored rollouts, recomputed for GRPO, GiGPO, GraphGPO, MileGPO and each MileGPO ablation.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import networkx as nx
import numpy as np
from rich import box
from rich.table import Table as RichTable

from milegpo_cli.credit import CreditConfig, Rollout, RolloutBatch
from milegpo_cli.experiments import plots
from milegpo_cli.experiments.diagnostics import (
    N_RESAMPLES, compare_estimators, diagnose_credit, entered_keys, estimator_variants, milestone_match, roc_auc)
from milegpo_cli.experiments.runs import ExperimentError, dumps
from milegpo_cli.experiments.stats import format_interval

FORMATS = ("table", "json")
STORED = "stored"  # name prefix of the diagnostics of the advantages a run trained with


def stored_rollouts(store, run_id: int, iteration: int | None = None) -> dict:
    """Training rollouts of a run (one iteration or all) in credit form, with per-step labels.

    Groups are named ``"<iteration>/<group>"``; errored episodes (left out of credit in training)
    are left out here too. Per-step lists are flattened rollout by rollout, as ``RolloutBatch``.
    """
    episodes = [e for e in store.episodes(run_id, iteration=iteration) if not e["error"]]
    by_episode: dict[int, list[dict]] = defaultdict(list)
    for s in store.steps(run_id, iteration=iteration):
        by_episode[s["episode_id"]].append(s)
    rollouts, good, subgoals, advantage, task_of = [], [], [], [], {}
    for e in episodes:
        steps = by_episode.get(e["id"], [])
        group = f"{e['iteration']}/{e['group']}"
        task_of[group] = (e["task_id"], e["task_type"])
        rollouts.append(Rollout(group=group, rollout_id=e["index"], states=[s["state_key"] for s in steps],
                                actions=[s["action"] for s in steps], rewards=[s["reward"] for s in steps],
                                outcome=e["outcome"], success=bool(e["success"]), final_state=e.get("final_state"),
                                task=e["task_id"], iteration=e["iteration"]))  # credit.memory sees the run's order
        good += [s["oracle_good"] for s in steps]
        subgoals += [tuple(s["subgoals"] or ()) for s in steps]
        advantage += [s["advantage"] for s in steps]
    return {"rollouts": rollouts, "oracle_good": good, "subgoals": subgoals,
            "advantage": np.asarray(advantage, dtype=float), "task_of": task_of}


def trained_credit_auc(store, run_id: int) -> float | None:
    """ROC-AUC of the advantages a run trained with against its training steps' oracle labels
    (None: no step of one of the two labels)."""
    data = stored_rollouts(store, run_id)
    known = np.array([g is not None for g in data["oracle_good"]], dtype=bool)
    good = np.array([bool(g) for g in data["oracle_good"]], dtype=bool)
    auc = roc_auc(data["advantage"][known], good[known]) if known.any() else float("nan")
    return None if np.isnan(auc) else auc


def group_graph(rollouts: list[Rollout], group: str) -> nx.MultiDiGraph:
    """The rollout graph of one group (docs/algorithms.md): state keys plus SUCCESS / FAIL; edges carry action and rollouts."""
    g = nx.MultiDiGraph()
    for r in rollouts:
        if r.group != group:
            continue
        nxt = list(r.states[1:]) + ["SUCCESS" if r.success else "FAIL"]
        for u, a, v in zip(r.states, r.actions, nxt):
            key = (a, v)
            if g.has_edge(u, v, key):
                g.edges[u, v, key]["rollouts"].add(r.rollout_id)
            else:
                g.add_edge(u, v, key=key, action=a, rollouts={r.rollout_id})
    return g


def _evolution(cands: list[dict]) -> list[dict]:
    """Per iteration: counts, mean rho and the share confirmed by the progress / branch tests."""
    out = []
    for it in sorted({c["iteration"] for c in cands}):
        row = {"iteration": it}
        for kind in ("milestone", "trap"):
            cs = [c for c in cands if c["iteration"] == it and c["kind"] == kind]
            prog = [c["progress_ok"] for c in cs if c["progress_ok"] is not None]
            br = [c["branch_ok"] for c in cs if c["branch_ok"] is not None]
            row[f"{kind}s"] = len(cs)
            row[f"{kind}_rho"] = float(np.mean([c["rho"] for c in cs])) if cs else None
            row[f"{kind}_progress_ok"] = float(np.mean(prog)) if prog else None
            row[f"{kind}_branch_ok"] = float(np.mean(br)) if br else None
        out.append(row)
    return out


def _recurring(cands: list[dict], task_of: dict, limit: int = 20) -> list[dict]:
    """Candidates of one task met in several iterations, with their rho over time."""
    seen: dict[tuple, list[tuple[int, float]]] = defaultdict(list)
    for c in cands:
        task = task_of.get(f"{c['iteration']}/{c['group']}", ("?", "?"))[0]
        seen[(task, c["kind"], c["key"])].append((c["iteration"], c["rho"]))
    rows = [{"task_id": t, "kind": k, "key": key, "iterations": [i for i, _ in v], "rho": [r for _, r in v]}
            for (t, k, key), v in seen.items() if len({i for i, _ in v}) > 1]
    return sorted(rows, key=lambda r: -len(r["iterations"]))[:limit]


def _pick_group(cands: list[dict], rollouts: list[Rollout], iteration: int) -> str | None:
    """The group of ``iteration`` with the most candidates (then mixed outcomes), for the graph plot."""
    groups = {r.group for r in rollouts if r.group.split("/", 1)[0] == str(iteration)}
    if not groups:
        return None
    count = defaultdict(int)
    for c in cands:
        if c["iteration"] == iteration:
            count[f"{iteration}/{c['group']}"] += 1
    mixed = {g: len({r.success for r in rollouts if r.group == g}) > 1 for g in groups}
    return max(sorted(groups), key=lambda g: (count[g], mixed[g]))


def diagnose(store, run_id: int | str, iteration: int | None = None, out_dir: str | Path | None = None,
             n_resamples: int = N_RESAMPLES, seed: int = 0) -> dict:
    """The diagnosis of a stored run as a JSON-serialisable dict (plots written to ``out_dir``).

    Candidates are shown for ``iteration`` (default: the last); credit diagnostics use the rollouts
    of that iteration when given, else of every iteration.
    """
    run = store.get_run(run_id)  # RunNotFound for an unknown run
    rid = run["id"]
    iteration_rows = store.iterations(rid)
    its = [it["iteration"] for it in iteration_rows]
    if not its:
        raise ExperimentError(f"diagnose: run {rid} has no stored iterations yet")
    if iteration is not None and iteration not in its:
        raise ExperimentError(f"iteration: run {rid} has iterations {its[0]}..{its[-1]}, not {iteration}")
    focus = its[-1] if iteration is None else iteration
    cands = store.candidates(rid)
    data = stored_rollouts(store, rid, iteration)
    rollouts = data["rollouts"]
    if not rollouts:
        raise ExperimentError(f"diagnose: run {rid} has no stored training episodes")
    credit_cfg = (run["config"] or {}).get("credit") or {}
    config = replace(CreditConfig.from_dict(credit_cfg), drop=())

    focus_cands = [c for c in cands if c["iteration"] == focus]
    per_task = defaultdict(list)
    for c in focus_cands:
        task_id, task_type = data["task_of"].get(f"{focus}/{c['group']}", ("?", "?"))
        per_task[task_id].append({k: c[k] for k in ("group", "kind", "key", "n_pos", "n_neg", "rho", "distance",
                                                    "progress_ok", "branch_ok", "credit")} | {"task_type": task_type})

    # credit diagnostics: the stored advantages first, then every estimator recomputed
    batch = RolloutBatch.from_rollouts(rollouts, success_threshold=config.success_threshold)
    step_group = np.asarray(batch.step_group)
    entered = entered_keys(batch, rollouts)
    used = [c for c in cands if iteration is None or c["iteration"] == iteration]
    found = defaultdict(set)
    for c in used:
        if c["kind"] == "milestone" and c["credit"] > 0:
            found[f"{c['iteration']}/{c['group']}"].add(c["key"])
    matches = None
    if run["algo"] == "milegpo":
        matches = [milestone_match([entered[j] for j in js], [data["subgoals"][j] for j in js], found[name])
                   for name, js in ((n, np.flatnonzero(step_group == g)) for g, n in enumerate(batch.group_names))]
    stored_label = f"{STORED}: {method_label(run['algo'], run['drop'])}"
    diags = [diagnose_credit(data["advantage"], step_group, data["oracle_good"], name=stored_label, algo=run["algo"],
                             drop=run["drop"] or (), milestones=matches, n_resamples=n_resamples, seed=seed)]
    diags += compare_estimators(rollouts, data["oracle_good"], data["subgoals"], config=config,
                                success_threshold=config.success_threshold, variants=estimator_variants(),
                                n_resamples=n_resamples, seed=seed)

    result = {
        "run": {k: run[k] for k in ("id", "name", "algo", "drop", "seed", "status")},
        "iteration": focus, "iterations": its, "diagnostics_iterations": "all" if iteration is None else iteration,
        "candidates": dict(per_task), "evolution": _evolution(cands),
        "recurring": _recurring(cands, data["task_of"]),
        "credit": [d.to_dict() for d in diags],
        "labelled_steps": int(sum(g is not None for g in data["oracle_good"])),
        "memory": memory_rows(iteration_rows),
        "plots": [],
    }
    if out_dir is not None:
        out_dir = Path(out_dir)
        group = _pick_group(cands, rollouts, focus)
        if group is not None:
            mine = [c for c in focus_cands if f"{focus}/{c['group']}" == group]
            start = next(r.states[0] for r in rollouts if r.group == group and len(r.states))
            path = plots.rollout_graph(
                group_graph(rollouts, group), out_dir / f"graph_run{rid}_it{focus}_{group.replace('/', '_')}.png",
                milestones={c["key"]: c["rho"] for c in mine if c["kind"] == "milestone"},
                traps={c["key"]: c["rho"] for c in mine if c["kind"] == "trap"}, start=start,
                title=f"run {rid} iteration {focus} group {group} ({data['task_of'][group][0]})")
            result["plots"].append(str(path))
            result["graph_group"] = group
        evo = result["evolution"]
        if evo:
            curves = {k: [([e["iteration"] for e in evo], [e[k] for e in evo])] for k in ("milestones", "traps")}
            result["plots"].append(str(plots.learning_curves(curves, out_dir / f"candidates_run{rid}.png",
                                                             title=f"run {rid}: candidates per iteration",
                                                             ylabel="count")))
    return result


MEMORY_METRICS = {"all_fail_groups": "memory_all_fail_groups", "credited_groups": "memory_credited_groups",
                  "credit_abs_mean": "memory_credit_abs_mean", "tasks": "memory_tasks", "entries": "memory_entries"}


def memory_rows(iterations: list[dict]) -> list[dict]:
    """Per training iteration with ``credit.memory`` (trainer/credit_memory.py): groups without a success, those
    that got memory credit, the mean |credit| of their steps, the memory's tasks and entries."""
    return [{"iteration": it["iteration"], **{k: (it["metrics"] or {}).get(m) for k, m in MEMORY_METRICS.items()}}
            for it in iterations if MEMORY_METRICS["credited_groups"] in (it["metrics"] or {})]


def _estimate_text(est: dict | None) -> str:
    if est is None or est["value"] is None or not np.isfinite(est["value"]):  # nan: a class is empty
        return "-"
    return format_interval(est["value"], est["low"], est["high"])


def _number_text(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def method_label(algo: str, drop) -> str:
    """``milegpo -reliability``: the algo and its ablated components (as ``RunData.method``)."""
    return algo + "".join(f" -{d}" for d in sorted(drop or ()))


def _table(title: str, columns: list[str]) -> RichTable:
    """A compact table (fits 80 columns); the first column is never wrapped or cut."""
    t = RichTable(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for i, c in enumerate(columns):
        t.add_column(c, no_wrap=i == 0)
    return t


def render_diagnosis(d: dict, fmt: str = "table"):
    """``json``: a string (strict JSON); ``table``: a list of rich renderables."""
    if fmt == "json":
        return dumps(d)
    if fmt != "table":
        raise ExperimentError(f"format: must be one of {', '.join(FORMATS)}, got {fmt!r}")
    r = d["run"]
    out = []
    t = _table(f"run {r['id']} ({r['name']}, {r['algo']}): milestones and traps, iteration {d['iteration']} "
               "(progress, branch: share of credited entries passing the test)",
               ["task", "kind", "key", "n+", "n-", "rho", "d", "progress", "branch", "credit"])
    for task, cs in sorted(d["candidates"].items()):
        for c in sorted(cs, key=lambda c: (c["kind"], -abs(c["rho"]))):
            t.add_row(task, c["kind"], c["key"][:40], str(c["n_pos"]), str(c["n_neg"]), f"{c['rho']:+.2f}",
                      "inf" if c["distance"] is None else f"{c['distance']:.0f}", _number_text(c["progress_ok"]),
                      _number_text(c["branch_ok"]), f"{c['credit']:+.3f}")
    out.append(t)
    t = _table("candidates over training", ["iteration", "milestones", "rho+", "progress ok", "branch ok", "traps", "rho-"])
    f = _number_text
    for e in d["evolution"]:
        t.add_row(str(e["iteration"]), str(e["milestones"]), f(e["milestone_rho"]), f(e["milestone_progress_ok"]),
                  f(e["milestone_branch_ok"]), str(e["traps"]), f(e["trap_rho"]))
    out.append(t)
    if d.get("memory"):
        t = _table("memory across iterations (credit.memory): groups without a success that got memory credit",
                   ["iteration", "all-fail groups", "with memory credit", "mean |credit|", "tasks", "entries"])
        for m in d["memory"]:
            t.add_row(str(m["iteration"]), f"{m['all_fail_groups']:.0f}", f"{m['credited_groups']:.0f}",
                      f"{m['credit_abs_mean']:.3f}", f"{m['tasks']:.0f}", f"{m['entries']:.0f}")
        out.append(t)
    stored = next((c for c in d["credit"] if c["name"].startswith(STORED)), None)
    t = _table(f"credit diagnostics on the stored rollouts ({d['labelled_steps']} oracle-labelled steps; 95% CI over "
               "groups)" + (f"; stored = the advantages the run trained with ({method_label(stored['algo'], stored['drop'])})"
                           if stored else ""),
               ["estimator", "groups", "good/bad", "ROC-AUC", "sign acc.", "ms. prec.", "ms. recall"])
    for c in d["credit"]:
        label = STORED if c is stored else method_label(c["algo"], c["drop"])
        t.add_row(label, str(c["n_groups"]), f"{c['n_good']}/{c['n_bad']}", _estimate_text(c["auc"]), _estimate_text(c["sign_accuracy"]),
                  _estimate_text(c["milestone_precision"]), _estimate_text(c["milestone_recall"]))
    out.append(t)
    if d["plots"]:
        out.append("plots: " + ", ".join(d["plots"]))
    return out


def run_diagnose(store, run: int | str, iteration: int | None, fmt: str, out_dir: str | Path | None, console) -> dict:
    """``milegpo diagnose``: print tables (or JSON); plots go to ``out_dir`` (default
    ``<store root>/diagnose/run<ID>``)."""
    if fmt not in FORMATS:
        raise ExperimentError(f"format: must be one of {', '.join(FORMATS)}, got {fmt!r}")
    row = store.get_run(run)
    if out_dir is None:
        out_dir = Path(((row["config"] or {}).get("store") or {}).get("root") or "runs") / "diagnose" / f"run{row['id']}"
    d = diagnose(store, row["id"], iteration, out_dir)
    if fmt == "json":
        console.out(render_diagnosis(d, "json"), highlight=False)
    else:
        for part in render_diagnosis(d, "table"):
            console.print(part)
    return d
