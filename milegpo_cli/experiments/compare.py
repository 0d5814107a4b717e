"""Side-by-side comparison of runs and learning curves with seed bands (``milegpo compare``)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from milegpo_cli.experiments import plots
from milegpo_cli.experiments.report_render import Table, to_rich
from milegpo_cli.experiments.runs import ExperimentError, RunData, dumps, resolve

FORMATS = ("table", "json")
SPLITS = ("id", "ood")
CURVE_METRICS = ("success_rate", "mean_outcome", "mean_length")


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


def compare_table(runs: Sequence[RunData]) -> tuple[Table, list[dict]]:
    """One row per run: final and best success / score on id and ood, steps, wall time."""
    if not runs:
        raise ExperimentError("compare: no runs given")
    cols = ["run", "name", "method", "seed", "status"]
    for s in SPLITS:
        cols += [f"final {s}", f"best {s}", f"score {s}"]
    cols += ["iterations", "steps", "wall s"]
    rows, data = [], []
    for r in runs:
        d = {"run_id": r.run_id, "name": r.name, "method": r.method, "algo": r.algo, "drop": list(r.drop),
             "seed": r.seed, "status": r.status, "experiment": r.experiment, "steps": r.steps, "wall_s": r.wall_s}
        row = [str(r.run_id), r.name, r.method, str(r.seed), r.status]
        for s in SPLITS:
            fin, best = r.final(s), r.best(s)
            d[s] = {"final_success": fin and fin.success, "final_score": fin and fin.score,
                    "final_iteration": fin and fin.iteration, "best_success": best and best.success,
                    "best_iteration": best and best.iteration}
            row += [_pct(fin and fin.success), _pct(best and best.success), _pct(fin and fin.score)]
        its = max((it for pts in r.curves.values() for it, _ in pts), default=0)  # training iterations 1..N (0: the starting policy)
        d["iterations"] = its
        row += [str(its), str(r.steps), f"{r.wall_s:.0f}"]
        rows.append(row)
        data.append(d)
    return Table("compare: final and best evaluation (%)", cols, rows), data


def curve_plots(runs: Sequence[RunData], out_dir: str | Path, *, group_by_method: bool = True) -> list[Path]:
    """Learning curves (training metrics and evaluation success), one line per method with a seed band."""
    out_dir = Path(out_dir)
    label = (lambda r: r.method) if group_by_method else (lambda r: f"{r.run_id}:{r.name}")
    paths = []
    series: dict[str, dict[str, list]] = {}
    for r in runs:
        for m in CURVE_METRICS:
            if r.curves.get(m):
                series.setdefault(f"train_{m}", {}).setdefault(label(r), []).append(tuple(zip(*r.curves[m])))
        for s in SPLITS:
            pts = r.eval_curve(s)
            if pts:
                series.setdefault(f"eval_{s}_success", {}).setdefault(label(r), []).append(tuple(zip(*pts)))
    for name, curves in sorted(series.items()):
        paths.append(plots.learning_curves(curves, out_dir / f"curve_{name}.png", title=name.replace("_", " "),
                                           ylabel=name.split("_", 1)[1]))
    return paths


def compare(store, refs: list[str], out_dir: str | Path | None = None) -> dict:
    """Table data and learning-curve plots (written to ``out_dir``) for runs / experiments."""
    runs = resolve(store, refs)
    table, data = compare_table(runs)
    paths = curve_plots(runs, out_dir) if out_dir is not None else []
    return {"table": table, "runs": data, "plots": [str(p) for p in paths]}


def run_compare(store, refs: list[str], out_dir: str | Path | None, console, fmt: str = "table") -> dict:
    """``milegpo compare``: print the table (``fmt`` table) or only the document ``{"runs", "plots"}``
    (``fmt`` json, docs/cli.md); write the plots (default ``<store root>/compare``)."""
    if fmt not in FORMATS:
        raise ExperimentError(f"format: must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if out_dir is None:
        out_dir = Path(resolve(store, refs[:1])[0].root if refs else "runs") / "compare"
    result = compare(store, refs, out_dir)
    if fmt == "json":
        console.out(dumps({"runs": result["runs"], "plots": result["plots"]}), highlight=False)
    else:
        console.print(to_rich([result["table"]])[0])
        console.print("plots: " + ", ".join(result["plots"]))
    return result
