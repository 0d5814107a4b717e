"""``milegpo sweep``: a grid of config values over seeds, as one experiment.

``--grid section.key=V1,V2,...`` (repeatable) gives each key its values (TOML values, as ``--set``);
the variants are the product of the grids, each trained over seeds 0..N-1. A sweep is an experiment
of the same kind as an ablation (experiments/ablate.py :func:`run_experiment`): members registered
before they train, resumable by its spec (its name is ``sweep-<recipe>-<sha of the spec>``), parent
and child MLflow runs, seed-by-seed order, ``--parallel`` or ``--ray``. ``milegpo report`` labels
its runs by their grid values and ranks the variants (report.variants_table).
"""
from __future__ import annotations

import itertools
import json
import math
from typing import Any, Sequence

from milegpo_cli.config import Config, flatten, parse_value
from milegpo_cli.errors import ConfigError
from milegpo_cli.experiments.ablate import Member, member_config, run_experiment
from milegpo_cli.experiments.runs import ExperimentError, dotted

MAX_UNCONFIRMED = 500  # members a sweep registers without --yes (registering takes ~0.3 s each before any training)
FIXED = ("run.seed", "run.name", "run.algo", "credit.drop")  # set by --seeds; one algo and drop per sweep (ablate varies those)


def _split_values(text: str) -> list[str]:
    """``1e-4,3e-4`` -> ["1e-4", "3e-4"]; commas inside [...] or quotes belong to the value."""
    out, depth, quote, cur = [], 0, "", ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        cur += ch
    return out + [cur.strip()]


def parse_grid(config: Config, texts: Sequence[str]) -> list[tuple[str, list[Any]]]:
    """``section.key=V1,V2`` strings -> [(key, values)] in order; unknown or fixed keys, empty or
    repeated values are errors."""
    known = flatten(config.to_dict())
    grid: list[tuple[str, list[Any]]] = []
    for text in texts:
        key, sep, rest = text.partition("=")
        key = key.strip()
        if not sep or not key or not rest.strip():
            raise ExperimentError(f"--grid {text!r}: expected section.key=V1,V2,...")
        if key in FIXED or key.startswith("store."):
            raise ExperimentError(f"--grid {key}: not a sweep key (seeds come from --seeds; use ablate for algos and drops)")
        if key not in known:
            raise ExperimentError(f"--grid {key}: unknown config key")
        if key in dict(grid):
            raise ExperimentError(f"--grid {key}: given twice")
        values = [parse_value(v) for v in _split_values(rest)]
        if len({repr(v) for v in values}) != len(values) or any(v == "" for v in values):
            raise ExperimentError(f"--grid {key}: empty or repeated values in {rest!r}")
        _refuse_equal_settings(config, key, values)
        grid.append((key, values))
    if not grid:
        raise ExperimentError("sweep: give at least one --grid section.key=V1,V2,...")
    return grid


def _refuse_equal_settings(config: Config, key: str, values: list[Any]) -> None:
    """Two values that the config turns into one setting (``0`` and ``0.0`` for a float) would train one
    member twice: refused in one line. A value the config refuses is left to :func:`members`."""
    seen: dict[str, Any] = {}
    for value in values:
        try:
            setting = dotted(member_config(config, Member(config.run.algo, (), 0, ((key, value),))).to_dict(), key)
        except ConfigError:
            continue
        text = json.dumps(setting, sort_keys=True)
        if text in seen:
            raise ExperimentError(f"--grid {key}: {seen[text]!r} and {value!r} are the same setting ({text}); "
                                  "give each value once")
        seen[text] = value


def members(config: Config, grid: Sequence[tuple[str, list[Any]]], seeds: int) -> list[Member]:
    """Every combination of the grid's values x seeds 0..seeds-1, each checked as a config."""
    if seeds < 1:
        raise ExperimentError(f"seeds: must be >= 1, got {seeds}")
    keys = [k for k, _ in grid]
    drop = tuple(sorted(config.credit.drop))
    out = []
    for values in itertools.product(*(v for _, v in grid)):
        sets = tuple(zip(keys, values))
        try:
            member_config(config, Member(config.run.algo, drop, 0, sets))
        except ConfigError as err:
            raise ExperimentError(f"--grid {' '.join(f'{k}={v}' for k, v in sets)}: {err}") from None
        out += [Member(config.run.algo, drop, s, sets) for s in range(seeds)]
    return out


def count_members(grid: Sequence[tuple[str, list[Any]]], seeds: int) -> int:
    return math.prod(len(values) for _, values in grid) * seeds


def sweep_grid(config: Config, grid_texts: Sequence[str], seeds: int, yes: bool) -> list[tuple[str, list[Any]]]:
    """The sweep's grid (:func:`parse_grid`), refused in one line when it makes more than
    :data:`MAX_UNCONFIRMED` members without ``yes`` (``--yes``). Needs no store: the CLI calls it before it
    creates one, so a refused grid creates nothing."""
    grid = parse_grid(config, grid_texts)
    n = count_members(grid, seeds)
    if n > MAX_UNCONFIRMED and not yes:
        raise ExperimentError(f"sweep: the grid makes {n} members ({n // seeds} variants x {seeds} seeds), more than "
                              f"{MAX_UNCONFIRMED}; registering them takes about {n * 0.3 / 60:.0f} min before any "
                              "training: pass --yes to go on")
    return grid


def run_sweep(config: Config, store, tracker_uri: str | None, grid_texts: Sequence[str], seeds: int, console,
              parallel: int = 1, ray=None, yes: bool = False) -> int:
    """Run (or resume) the sweep; returns its experiment id. The grid is checked (:func:`sweep_grid`)
    before anything is registered."""
    grid = sweep_grid(config, grid_texts, seeds, yes)
    ms = members(config, grid, seeds)
    params = {"sweep": {"grid": {k: v for k, v in grid}, "seeds": seeds, "recipe": config.recipe}}
    return run_experiment(config, store, tracker_uri, ms, "sweep", params, console, parallel, ray)
