"""Plain views of stored runs for the experiment commands (read-only; SQLite + MLflow hold the truth).

``RunData`` carries what compare / report need of a run: identity (algo, ablated components, seed,
experiment), cost (environment steps, wall time), training curves and evaluation results per
iteration, split and task type. ``list_doc`` / ``show_doc`` are the documents of ``milegpo runs``
and ``milegpo runs show`` (``--json``; shapes in docs/cli.md), ``list_table`` / ``show_tables``
their tables.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Sequence

import numpy as np
from rich import box
from rich.table import Table

from milegpo_cli.credit import CreditConfig
from milegpo_cli.credit.config import canonical_formulation
from milegpo_cli.errors import MilegpoError, RunNotFound
from milegpo_cli.intervals import wilson_interval

ALL = "all"  # task_type of a whole-split evaluation
DEFAULT_FORMULATION = CreditConfig().formulation


def json_safe(o):
    """NaN / inf -> None, sets -> sorted lists, numpy scalars -> Python (strict JSON)."""
    if isinstance(o, dict):
        return {str(k): json_safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in (sorted(o) if isinstance(o, (set, frozenset)) else o)]
    if isinstance(o, (float, np.floating)):
        return float(o) if np.isfinite(o) else None
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, datetime):
        return o.isoformat()
    return o


def dumps(doc) -> str:
    """The JSON text of a ``--json`` document (strict JSON, see ``json_safe``)."""
    return json.dumps(json_safe(doc), indent=2, allow_nan=False)


class ExperimentError(MilegpoError, ValueError):
    """Bad input to an experiment command (no runs to compare, unknown grouping, ...)."""


@dataclass(frozen=True)
class EvalResult:
    """Evaluation of one run at one iteration on one split (``task_type`` ALL: the whole split)."""

    iteration: int
    split: str
    task_type: str
    success: float
    score: float
    episodes: int


@dataclass(frozen=True)
class RunData:
    run_id: int
    name: str
    algo: str
    drop: tuple[str, ...]
    seed: int
    status: str
    env: str
    experiment: str | None = None
    steps: int = 0  # environment steps taken in training
    wall_s: float = 0.0
    evals: tuple[EvalResult, ...] = ()
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # metric -> (iteration, value)
    root: str = "runs"  # the run's output folder (config store.root), for default plot folders
    formulation: str = DEFAULT_FORMULATION  # MileGPO's credit.formulation
    preset: str = ""  # credit.preset
    grid: str = ""  # a sweep member's grid values, "ppo.lr=0.0001 rollout.groups=4" (experiment_runs)

    @property
    def variant(self) -> str:
        """`` (<formulation>)`` for a MileGPO run of a formulation other than the default, `` (verl-agent)`` for a
        GraphGPO run under that preset (told apart from the rows of the old convention), else ``""``."""
        if self.algo == "graphgpo" and self.preset == "verl-agent":
            return " (verl-agent)"
        return f" ({self.formulation})" if self.algo == "milegpo" and self.formulation != DEFAULT_FORMULATION else ""

    @property
    def method(self) -> str:
        """algo, with its formulation, ablated components and sweep values (e.g. ``milegpo -reliability``,
        ``milegpo (paper)``, ``milegpo ppo.lr=0.0001``)."""
        return self.algo + self.variant + "".join(f" -{d}" for d in sorted(self.drop)) + (f" {self.grid}" if self.grid else "")

    def final(self, split: str, task_type: str = ALL) -> EvalResult | None:
        """The evaluation at the last evaluated iteration."""
        rows = [e for e in self.evals if e.split == split and e.task_type == task_type]
        return max(rows, key=lambda e: e.iteration) if rows else None

    def best(self, split: str, metric: str = "success") -> EvalResult | None:
        rows = [e for e in self.evals if e.split == split and e.task_type == ALL]
        return max(rows, key=lambda e: (getattr(e, metric), -e.iteration)) if rows else None

    def task_types(self, split: str) -> list[str]:
        return sorted({e.task_type for e in self.evals if e.split == split and e.task_type != ALL})

    def eval_curve(self, split: str, metric: str = "success") -> list[tuple[int, float]]:
        rows = sorted((e.iteration, getattr(e, metric)) for e in self.evals if e.split == split and e.task_type == ALL)
        return rows


# --- reading the store ----------------------------------------------------------------------

def _evals(store, run_id: int, last_iteration: int) -> list[EvalResult]:
    """Whole-split and per-task-type results of every stored evaluation of a run.

    An evaluation without an iteration (run after training) is placed after the last iteration.
    """
    out = []
    for ev in store.evaluations(run_id):
        it = ev["iteration"] if ev["iteration"] is not None else last_iteration + 1
        eps = [e for e in store.episodes(run_id, evaluation_id=ev["id"]) if not e["error"]]
        if eps:
            out.append(EvalResult(it, ev["split"], ALL, sum(e["success"] for e in eps) / len(eps),
                                  sum(e["outcome"] for e in eps) / len(eps), len(eps)))
        elif ev["success_rate"] is not None:
            out.append(EvalResult(it, ev["split"], ALL, ev["success_rate"], ev["mean_outcome"] or 0.0, ev["episodes"]))
        by_type: dict[str, list[dict]] = {}
        for e in eps:
            by_type.setdefault(e["task_type"], []).append(e)
        for t, rows in sorted(by_type.items()):
            out.append(EvalResult(it, ev["split"], t, sum(e["success"] for e in rows) / len(rows),
                                  sum(e["outcome"] for e in rows) / len(rows), len(rows)))
    return out


def load_run(store, ref: int | str) -> RunData:
    """A run of the store as RunData; raises the store's RunNotFound for an unknown id or name."""
    run = store.get_run(ref)
    its = store.iterations(run["id"])
    curves: dict[str, list[tuple[int, float]]] = {}
    steps, wall = 0.0, 0.0
    for it in its:
        metrics = {**(it["metrics"] or {}), **{k: it[k] for k in ("success_rate", "mean_outcome", "mean_length")}}
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None:
                curves.setdefault(k, []).append((it["iteration"], float(v)))
        steps += float((it["metrics"] or {}).get("steps") or 0.0)
        wall += sum(float((it["metrics"] or {}).get(k) or 0.0) for k in ("time_rollout_s", "time_credit_s", "time_update_s"))
    last = max((it["iteration"] for it in its), default=-1)
    config = run["config"] or {}
    env = (config.get("env") or {}).get("name", "")
    return RunData(
        run_id=run["id"], name=run["name"], algo=run["algo"], drop=tuple(sorted(run["drop"] or ())),
        seed=int(run["seed"]), status=run["status"], env=env,
        experiment=None if run["experiment_id"] is None else str(run["experiment_id"]),
        steps=int(steps), wall_s=wall, evals=tuple(_evals(store, run["id"], last)), curves=curves,
        root=(config.get("store") or {}).get("root") or "runs",
        formulation=canonical_formulation((config.get("credit") or {}).get("formulation") or DEFAULT_FORMULATION),
        preset=(config.get("credit") or {}).get("preset") or "",
    )


def experiment_runs(store, ref: int | str) -> tuple[dict, list[RunData]]:
    """An experiment (by id or name) and its runs; raises RunNotFound when it does not exist."""
    exp = store.get_experiment(ref)
    rows = store.list_runs(experiment_id=exp["id"])
    keys = grid_keys(exp)
    return exp, [replace(load_run(store, r["id"]), grid=grid_label(r["config"], keys)) if keys else load_run(store, r["id"])
                 for r in rows]


def grid_keys(exp: dict) -> list[str]:
    """The config keys a sweep experiment varies (its spec's variants, or an older spec's members, carry
    {key: value}); [] otherwise."""
    spec = exp.get("config") or {}
    variants = spec.get("variants") or [m[:2] + m[3:] for m in spec.get("members") or []]
    return sorted({k for v in variants if len(v) > 2 for k in v[2]})


def grid_label(config: dict, keys: Sequence[str]) -> str:
    """"ppo.lr=0.0001 rollout.groups=4": a run's values of the sweep's keys (as ablate.Member.variant)."""
    return " ".join(f"{k}={dotted(config, k)}" for k in keys)


def dotted(config: dict, key: str):
    """The value at a dotted key of a config dict ("ppo.lr"); None where it is missing."""
    node = config
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def resolve(store, refs: list[str]) -> list[RunData]:
    """Runs named by ``refs``: a run id or name, or an experiment (``exp:<id|name>``, or a name or id
    that is no run) for all of its runs. Raises RunNotFound naming the first unknown ref."""
    out: list[RunData] = []
    for ref in refs:
        ref = str(ref)
        if ref.startswith("exp:"):
            out += experiment_runs(store, ref[4:])[1]
            continue
        try:
            out.append(load_run(store, ref))
        except RunNotFound:
            try:
                out += experiment_runs(store, ref)[1]
            except RunNotFound:
                raise RunNotFound(f"'{ref}' is neither a run nor an experiment in {store.display_url}") from None
    seen: set[int] = set()
    return [r for r in out if not (r.run_id in seen or seen.add(r.run_id))]


# --- `milegpo runs` and `milegpo runs show` ---------------------------------------------------
LIST_FIELDS = ("id", "name", "recipe", "algo", "seed", "drop", "status", "experiment_id", "mlflow_run_id",
               "git_commit", "created_at", "updated_at", "iterations", "last_success_rate")
SHOW_FIELDS = ("name", "recipe", "algo", "seed", "drop", "status", "experiment_id", "mlflow_run_id",
               "git_commit", "created_at", "updated_at")


def phase(evaluation: dict) -> str:
    """The policy an evaluation measured: untrained, warmstart or train. Rows stored without a phase:
    iteration 0 is the untrained model, any later one the trained policy."""
    return evaluation.get("phase") or ("untrained" if evaluation["iteration"] == 0 else "train")


def success_ci(evaluation: dict) -> list[float] | None:
    """Wilson 95% interval of an evaluation's success rate over its episodes."""
    n, rate = evaluation["episodes"], evaluation["success_rate"]
    ci = None if rate is None else wilson_interval(round(rate * n), n)
    return None if ci is None else list(ci)


def list_doc(store) -> list[dict]:
    """``milegpo runs --json``: one object per run, in id order (an empty list for an empty store)."""
    return json_safe([{k: r[k] for k in LIST_FIELDS} for r in store.list_runs()])


def show_doc(store, ref: int | str) -> dict:
    """``milegpo runs show RUN --json``: the run (with its resolved config), its iterations and evaluations."""
    run = store.get_run(ref)
    its = [{k: it[k] for k in ("iteration", "episodes", "success_rate", "mean_outcome", "mean_length",
                               "invalid_rate", "metrics")} for it in store.iterations(run["id"])]
    evs = [{"iteration": ev["iteration"], "phase": phase(ev), "split": ev["split"], "episodes": ev["episodes"],
            "success_rate": ev["success_rate"], "success_ci": success_ci(ev), "mean_outcome": ev["mean_outcome"],
            "checkpoint": ev["checkpoint"], "metrics": ev["metrics"] or {}} for ev in store.evaluations(run["id"])]
    return json_safe({"run": run, "iterations": its, "evaluations": evs})


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _table(*columns: str, title: str) -> Table:
    """Compact; only the last column wraps (folded: paths, names), the others keep their values whole."""
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for i, c in enumerate(columns):
        last = i == len(columns) - 1
        table.add_column(c, no_wrap=not last, overflow="fold" if last else "ellipsis")
    return table


def list_table(runs: list[dict]) -> Table:
    """The table of ``milegpo runs`` from ``list_doc``."""
    table = _table("id", "name", "algo", "seed", "drop", "status", "iters", "success", "created", title="runs")
    for r in runs:
        table.add_row(str(r["id"]), r["name"], r["algo"], str(r["seed"]), ",".join(r["drop"]) or "-", r["status"],
                      str(r["iterations"]), _pct(r["last_success_rate"]),
                      datetime.fromisoformat(r["created_at"]).strftime("%m-%d %H:%M"))
    return table


def show_tables(doc: dict) -> list[Table]:
    """The tables of ``milegpo runs show`` from ``show_doc``: fields, iterations, evaluations."""
    r = doc["run"]
    head = Table(show_header=False, title=f"run {r['id']}")
    for key in SHOW_FIELDS:
        head.add_row(key, ", ".join(r[key]) if key == "drop" else str(r[key]))
    its = _table("iteration", "episodes", "success", "outcome", "length", "invalid", title="iterations")
    for it in doc["iterations"]:
        its.add_row(str(it["iteration"]), str(it["episodes"]), _pct(it["success_rate"]), _num(it["mean_outcome"], 3),
                    _num(it["mean_length"], 1), _pct(it["invalid_rate"]))
    evs = _table("iter", "phase", "split", "episodes", "success", "95% CI", "outcome", "checkpoint",
                 title="evaluations (success with its Wilson 95% interval over the episodes)")
    for ev in doc["evaluations"]:
        ci = ev["success_ci"]
        evs.add_row(str(ev["iteration"]), ev["phase"], ev["split"], str(ev["episodes"]), _pct(ev["success_rate"]),
                    "-" if ci is None else f"{100 * ci[0]:.1f}-{100 * ci[1]:.1f}%", _num(ev["mean_outcome"], 3),
                    ev["checkpoint"] or "-")
    return [head, its, evs]
