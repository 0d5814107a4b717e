"""Evaluation learning curves of runs and the area under them (``milegpo report``).

A run's curve on a split is its evaluation metric at every evaluated iteration k (iteration 0: the
policy PPO starts from), with the environment steps it trained on through iteration k. Its area is
the normalised trapezoid over iterations, AUC = 1/K sum_k (y_k + y_{k-1}) / 2 (stats.normalised_area),
i.e. the curve's mean height: every method trains on the same episodes per iteration, so iterations
are the budget all methods share, while environment steps differ by method (successful episodes end
sooner). Pure functions on ``RunData``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from milegpo_cli.experiments import stats
from milegpo_cli.experiments.runs import RunData


@dataclass(frozen=True)
class CurvePoint:
    """One evaluated iteration of a method: mean steps trained by then and the metric over seeds."""

    iteration: int
    steps: float
    summary: stats.Summary

    def to_dict(self) -> dict:
        return {"iteration": self.iteration, "steps": self.steps, **self.summary.to_dict()}


def steps_through(run: RunData) -> dict[int, int]:
    """iteration k -> environment steps trained on in iterations 1..k (0 -> 0)."""
    out, total = {0: 0}, 0
    for it, n in sorted(run.curves.get("steps", [])):
        total += int(n)
        out[it] = total
    return out


def eval_curve(run: RunData, split: str, metric: str = "success") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(iterations, steps trained through each, metric values) of the run's evaluations on ``split``."""
    rows = run.eval_curve(split, metric)
    steps = steps_through(run)
    last = max(steps)
    its = np.array([i for i, _ in rows], dtype=int)
    return its, np.array([steps.get(i, steps[last]) for i in its], dtype=float), np.array([v for _, v in rows])


def area(run: RunData, split: str, metric: str = "success") -> float | None:
    """Normalised area under the run's evaluation curve over iterations (None: no evaluation)."""
    its, _, values = eval_curve(run, split, metric)
    return stats.normalised_area(its, values) if its.size else None


def common_curve(runs: Sequence[RunData], split: str, metric: str = "success", seed: int = 0) -> list[CurvePoint]:
    """The methods' curve over its seeds, at the iterations every run evaluated."""
    curves = [eval_curve(r, split, metric) for r in runs]
    curves = [c for c in curves if c[0].size]
    if not curves:
        return []
    shared = sorted(set.intersection(*(set(c[0].tolist()) for c in curves)))
    out = []
    for it in shared:
        at = [(c[1][c[0] == it][0], c[2][c[0] == it][0]) for c in curves]
        out.append(CurvePoint(it, float(np.mean([s for s, _ in at])), stats.summarize([v for _, v in at], seed=seed)))
    return out
