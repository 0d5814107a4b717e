"""A report's tables and data (:class:`Report`), rendered: md / csv / json / html text, rich tables
for the console, and PNG plots (experiments/report.py builds it)."""
from __future__ import annotations

import csv
import html
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
from rich import box
from rich.table import Table as RichTable

from milegpo_cli.experiments import plots
from milegpo_cli.experiments.runs import ExperimentError, dumps

FORMATS = ("table", "md", "csv", "json", "html")
SPLITS = ("id", "ood")


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]


@dataclass
class Report:
    title: str
    by: str
    baseline: str | None
    metrics: tuple[str, ...]
    data: dict  # JSON-serialisable numbers behind the tables
    tables: list[Table]
    plots: list[str] = field(default_factory=list)


def plot_report(report: Report, out_dir: str | Path) -> list[Path]:
    """Interval bars of each metric on each split and its learning curves against environment steps
    with 95% bands (PNG), recorded in ``report.plots``."""
    out = []
    for met in report.metrics:
        for split in SPLITS:
            series = {m: tuple(np.array([(p["steps"], p["mean"]["value"], p["mean"]["low"], p["mean"]["high"])
                                         for p in pts]).T)
                      for m, d in report.data["methods"].items() if (pts := d["curves"][split][met])}
            if series:
                out.append(plots.interval_curves(series, Path(out_dir) / f"report_curve_{met}_{split}.png",
                                                 title=f"{report.title}: {met} on {split} (95% CI over seeds)",
                                                 xlabel="environment steps trained", ylabel=met))
            rows = [(m, d["metrics"][met][split]["mean"]) for m, d in report.data["methods"].items()
                    if d["metrics"][met][split]]
            if not rows:
                continue
            path = plots.interval_bars([m for m, _ in rows], [e["value"] for _, e in rows], [e["low"] for _, e in rows],
                                       [e["high"] for _, e in rows], Path(out_dir) / f"report_{met}_{split}.png",
                                       title=f"{report.title}: {met} on {split} (95% CI)", ylabel=met)
            out.append(path)
    report.plots += [str(p) for p in out]
    return out


def render(report: Report, fmt: str) -> str:
    """Render as md / csv / json / html text (``table`` is rendered by ``to_rich``)."""
    if fmt == "json":
        return dumps({**report.data, "plots": report.plots})
    if fmt == "md":
        parts = []
        for t in report.tables:
            parts.append(f"### {t.title}\n\n| " + " | ".join(t.columns) + " |\n|" + "---|" * len(t.columns) + "\n"
                         + "".join("| " + " | ".join(r) + " |\n" for r in t.rows))
        return "\n".join(parts)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf)
        for t in report.tables:
            w.writerow([t.title])
            w.writerow(t.columns)
            w.writerows(t.rows)
            w.writerow([])
        return buf.getvalue()
    if fmt == "html":
        parts = [f"<html><head><meta charset='utf-8'><title>{html.escape(report.title)}</title></head><body>"]
        for t in report.tables:
            parts.append(f"<h3>{html.escape(t.title)}</h3><table border='1'><tr>"
                         + "".join(f"<th>{html.escape(c)}</th>" for c in t.columns) + "</tr>"
                         + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in t.rows)
                         + "</table>")
        parts += [f"<p><img src='{html.escape(Path(p).name)}'></p>" for p in report.plots]
        return "\n".join(parts + ["</body></html>"])
    raise ExperimentError(f"format: must be one of {', '.join(FORMATS)}, got {fmt!r}")


def to_rich(tables: Sequence[Table]):
    """rich Tables for the console: compact, the first column never cut, an interval on its own line."""
    out = []
    for t in tables:
        rt = RichTable(title=t.title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
        for i, c in enumerate(t.columns):
            rt.add_column(c, no_wrap=i == 0, min_width=max(map(len, c.split())))  # headers wrap, never cut
        for r in t.rows:
            rt.add_row(*(c.replace(" [", "\n[") for c in r))
        out.append(rt)
    return out
