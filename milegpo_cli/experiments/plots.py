"""Shared plotting: learning curves with seed bands, interval bars, rollout graphs (PNG).

Figures are built with ``matplotlib.figure.Figure`` (Agg canvas, no pyplot global state), so the
functions are safe in headless processes and tests.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import networkx as nx
import numpy as np
from matplotlib.figure import Figure

from milegpo_cli.outputs import OutputError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _save(fig: Figure, path: str | Path) -> Path:
    """Save as PNG; a folder that cannot be written (a read-only run folder) is one line naming --out."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png", dpi=110, bbox_inches="tight")
    except OSError as err:
        raise OutputError(f"cannot write the plot {path} ({err.strerror}); choose another folder with --out") from None
    return path


def _finish(fig: Figure, ax, path: str | Path, title: str, xlabel: str, ylabel: str, legend_size: int) -> Path:
    """Labels, title, grid and legend of a line plot, then save it."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)
    return _save(fig, path)


def learning_curves(
    curves: Mapping[str, Sequence[tuple[Sequence[float], Sequence[float]]]],
    path: str | Path,
    *,
    title: str = "",
    xlabel: str = "iteration",
    ylabel: str = "",
) -> Path:
    """One line per label: the mean over its seeds, with a band of mean +- 1 std (and min/max dots).

    ``curves[label]`` is a list of (x, y) per seed; seeds are aligned on the x values they share.
    """
    fig = Figure(figsize=(6.4, 4.0))
    ax = fig.add_subplot()
    for label, seeds in curves.items():
        seeds = [(np.asarray(x, float), np.asarray(y, float)) for x, y in seeds if len(x)]
        if not seeds:
            continue
        common = sorted(set.intersection(*(set(x.tolist()) for x, _ in seeds)))
        if not common:  # seeds share no x: draw them one by one
            for x, y in seeds:
                ax.plot(x, y, alpha=0.6, label=label)
            continue
        xs = np.asarray(common)
        ys = np.array([[dict(zip(x.tolist(), y.tolist()))[v] for v in common] for x, y in seeds])
        mean = ys.mean(axis=0)
        line, = ax.plot(xs, mean, label=f"{label} (n={len(seeds)})")
        if len(seeds) > 1:
            std = ys.std(axis=0, ddof=1)
            ax.fill_between(xs, mean - std, mean + std, color=line.get_color(), alpha=0.2)
    return _finish(fig, ax, path, title, xlabel, ylabel, legend_size=8)


def interval_curves(
    series: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float], Sequence[float]]],
    path: str | Path, *, title: str = "", xlabel: str = "", ylabel: str = "",
) -> Path:
    """One line per label through (x, mean) with its 95% interval (low, high) as a band."""
    fig = Figure(figsize=(6.4, 4.0))
    ax = fig.add_subplot()
    for label, (x, mean, low, high) in series.items():
        line, = ax.plot(x, mean, marker="o", markersize=3, label=label)
        ax.fill_between(x, low, high, color=line.get_color(), alpha=0.15)
    return _finish(fig, ax, path, title, xlabel, ylabel, legend_size=7)


def interval_bars(
    labels: Sequence[str], values: Sequence[float], lows: Sequence[float], highs: Sequence[float],
    path: str | Path, *, title: str = "", ylabel: str = "",
) -> Path:
    """Horizontal bars with 95% interval whiskers (one per method)."""
    v, lo, hi = (np.asarray(a, float) for a in (values, lows, highs))
    fig = Figure(figsize=(6.4, 0.5 + 0.45 * max(len(labels), 1)))
    ax = fig.add_subplot()
    pos = np.arange(len(labels))
    ax.barh(pos, v, xerr=np.stack([v - lo, hi - v]), capsize=3, color="#4C72B0", alpha=0.8)
    ax.set_yticks(pos, labels=list(labels))
    ax.invert_yaxis()
    ax.set_xlabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


MILESTONE, TRAP, START, SUCCESS_C, FAIL_C, STATE = "#1a9850", "#d73027", "#4575b4", "#006837", "#000000", "#bdbdbd"
LABEL_CHARS = 28  # node labels: the state key, cut to this length


def _short(key: str) -> str:
    return key if len(key) <= LABEL_CHARS else key[:LABEL_CHARS - 1] + "…"


def rollout_graph(graph: nx.MultiDiGraph, path: str | Path, **kw) -> Path:
    """``rollout_graph_figure`` saved as a PNG."""
    return _save(rollout_graph_figure(graph, **kw), path)


def rollout_graph_figure(
    graph: nx.MultiDiGraph, *, milestones: Mapping[str, float] = {},
    traps: Mapping[str, float] = {}, start: str | None = None, title: str = "",
) -> Figure:
    """Draw a group's rollout graph: milestones green, traps red (opacity = |rho|), the start state
    blue, the SUCCESS / FAIL terminals; credited nodes (milestones, traps) are labelled with their
    key and rho, and a legend explains colours and edge width (rollouts that took the transition,
    edge attribute ``rollouts``, a collection).
    """
    from matplotlib.lines import Line2D

    fig = Figure(figsize=(9, 6.5))
    ax = fig.add_subplot()
    simple = nx.DiGraph()
    simple.add_nodes_from(graph.nodes)
    for u, v, data in graph.edges(data=True):
        w = len(data.get("rollouts", ())) or 1
        simple.add_edge(u, v, weight=simple.get_edge_data(u, v, {"weight": 0})["weight"] + w)
    pos = nx.kamada_kawai_layout(simple) if simple.number_of_nodes() > 1 else {n: (0.0, 0.0) for n in simple}
    colours, sizes = [], []
    for n in simple.nodes:
        if n == "SUCCESS":
            colours.append(SUCCESS_C); sizes.append(420)
        elif n == "FAIL":
            colours.append(FAIL_C); sizes.append(420)
        elif n in milestones:
            colours.append((0.1, 0.6, 0.2, 0.35 + 0.65 * min(abs(milestones[n]), 1.0))); sizes.append(220)
        elif n in traps:
            colours.append((0.85, 0.1, 0.1, 0.35 + 0.65 * min(abs(traps[n]), 1.0))); sizes.append(220)
        elif n == start:
            colours.append(START); sizes.append(260)
        else:
            colours.append(STATE); sizes.append(80)
    width = lambda w: 0.5 + np.log1p(w)
    weights = [d["weight"] for _, _, d in simple.edges(data=True)]
    nx.draw_networkx_edges(simple, pos, ax=ax, width=[width(w) for w in weights], alpha=0.4, arrowsize=8,
                           node_size=sizes)
    nx.draw_networkx_nodes(simple, pos, ax=ax, node_color=colours, node_size=sizes, linewidths=0.5, edgecolors="#444444")
    for n in simple.nodes:  # credited nodes: key and rho; the start and the terminals: their role
        x, y = pos[n]
        if n in milestones or n in traps:
            rho = milestones[n] if n in milestones else traps[n]
            ax.annotate(f"{_short(n)}\nrho {rho:+.2f}", (x, y), xytext=(0, 9), textcoords="offset points",
                        ha="center", va="bottom", fontsize=7, color=MILESTONE if n in milestones else TRAP,
                        bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.75))
        if n in ("SUCCESS", "FAIL") or n == start:  # a credited start state gets both labels
            ax.annotate("start" if n == start else n, (x, y), xytext=(0, -11), textcoords="offset points",
                        ha="center", va="top", fontsize=7)
    node = lambda colour, size, label: Line2D([], [], marker="o", linestyle="", markersize=size, label=label,
                                              markerfacecolor=colour, markeredgecolor="#444444")
    handles = [node(MILESTONE, 9, f"milestone ({len(milestones)})"), node(TRAP, 9, f"trap ({len(traps)})"),
               node(START, 9, "start state"), node(SUCCESS_C, 11, "SUCCESS"), node(FAIL_C, 11, "FAIL"),
               node(STATE, 6, "other state")]
    top = max(weights, default=1)
    handles += [Line2D([], [], color="#444444", alpha=0.6, linewidth=width(w), label=f"{w} rollout{'s' * (w > 1)}")
                for w in sorted({1, top})]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False,
              title="node colour (opacity = |rho|)\nedge width = rollouts", title_fontsize=8, alignment="left")
    ax.set_title(title or f"{simple.number_of_nodes()} states, {len(milestones)} milestones, {len(traps)} traps",
                 fontsize=10)
    ax.axis("off")
    return fig


def is_png(path: str | Path) -> bool:
    """True when the file starts with the PNG signature."""
    with open(path, "rb") as f:
        return f.read(8) == PNG_MAGIC
