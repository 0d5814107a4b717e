"""``milegpo ablate``: the full method, each ablation (and optional baselines) over seeds, as one experiment.

An experiment is identified by its spec (base config, ablations, baseline algos; not its seeds): its
name is ``ablate-<recipe>-<sha of the spec>``, so running the same command again finds it and resumes
it: finished members are skipped, unfinished ones continue via ``train(resume_run=...)`` from
their last checkpoint, and a larger ``--seeds`` adds the new seeds' members to it. An ablate command
on the same base config that adds variants (ablations, baselines) extends the experiment the same way
(its name stays; its spec gains the variants). Members are pre-registered in the store (with the experiment id) and in
MLflow (child runs tagged ``mlflow.parentRunId`` under the experiment's parent run) before they
train, so a crash at any point leaves nothing to duplicate. This module plans; members train in this
process or ``parallel`` ``milegpo train --resume RUN`` subprocesses (experiments/local_dispatch.py),
or as Ray tasks on a cluster (``ray``, experiments/ray_dispatch.py). ``milegpo sweep`` (experiments/sweep.py) runs a grid of
config values through the same machinery (:func:`run_experiment`). Members train seed by seed (every variant's seed 0, then
seed 1, ...), so an experiment interrupted part way holds whole seeds of every variant: its
comparisons stay paired.
"""
from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from rich.table import Table as RichTable

from milegpo_cli.config import Config
from milegpo_cli.credit.config import RECIPE_SETTINGS, canonical_drop
from milegpo_cli.errors import ExperimentStopped, RunNotFound
from milegpo_cli.experiments import local_dispatch
from milegpo_cli.experiments.diagnostics import BASELINES, DEFAULT_ABLATIONS
from milegpo_cli.experiments.runs import ExperimentError, dotted
from milegpo_cli.run_folder import reroot
from milegpo_cli.store.locks import ExperimentLock, release_killed


@dataclass(frozen=True)
class Member:
    algo: str
    drop: tuple[str, ...]
    seed: int
    sets: tuple[tuple[str, Any], ...] = ()  # a sweep's grid values: (dotted key, value)

    @property
    def variant(self) -> str:
        return self.algo + "".join(f" -{d}" for d in self.drop) + "".join(f" {k}={v}" for k, v in self.sets)

    @property
    def label(self) -> str:
        return f"{self.variant} s{self.seed}"


@dataclass(frozen=True)
class RayOptions:
    """``--ray ADDRESS`` (auto, HOST:PORT, ray://HOST:10001, or local) and ``--ray-gpus``."""
    address: str
    gpus: float = 0.0  # num_gpus of each member's task


def members(config: Config, drops: Sequence[str] | None, seeds: int, algos: Sequence[str] | None = None) -> list[Member]:
    """Full method + each single ablation (``drops`` None: every component; []: none) (+ baselines)
    x seeds 0..seeds-1."""
    if seeds < 1:
        raise ExperimentError(f"seeds: must be >= 1, got {seeds}")
    base = tuple(sorted(config.credit.drop))
    try:
        ablations = [sorted(canonical_drop(d)) for d in (DEFAULT_ABLATIONS if drops is None else drops)]
    except ValueError as err:
        raise ExperimentError(str(err)) from None
    bad = [a for a in (algos or ()) if a not in BASELINES + ("milegpo",)]
    if bad:
        raise ExperimentError(f"algos: unknown baseline {bad[0]!r}; allowed: {', '.join(BASELINES)}")
    variants = [(config.run.algo, base)] + [(config.run.algo, tuple(sorted(set(base) | set(a)))) for a in ablations]
    variants += [(a, ()) for a in (algos or ()) if a != config.run.algo]
    variants = list(dict.fromkeys(variants))
    return [Member(a, d, s) for a, d in variants for s in range(seeds)]


def seed_major(plan: Sequence[tuple[Member, int]]) -> list[tuple[Member, int]]:
    """The training order: by seed, and within a seed in the order of ``members``."""
    return sorted(plan, key=lambda item: item[0].seed)


PRESET_BASELINES = ("gigpo", "graphgpo", "hgpo")


def member_config(config: Config, m: Member) -> Config:
    """The member's config; a GiGPO, GraphGPO or HGPO baseline row runs verl-agent's conventions (``credit.preset =
    "verl-agent"``, with the public recipe's gamma_G / mode for the environment, ``RECIPE_SETTINGS``) unless the
    recipe chose a preset, so that the baseline is the one its authors run."""
    d = config.to_dict()
    d["run"].update(algo=m.algo, seed=m.seed, name="")
    d["credit"]["drop"] = list(m.drop)
    for key, value in m.sets:
        *parents, last = key.split(".")
        node = d
        for part in parents:
            node = node[part]
        node[last] = value
    if m.algo in PRESET_BASELINES and m.algo != config.run.algo and not d["credit"].get("preset"):
        d["credit"]["preset"] = "verl-agent"
        d["credit"].update(RECIPE_SETTINGS.get((m.algo, config.env.name), {}))
    return Config.from_dict(d)


FOLDER = "<runs-dir>"  # the run folder in an experiment's spec: its identity does not depend on where it lives


def spec_of(config: Config, ms: Sequence[Member], legacy: bool = False) -> dict:
    """What identifies an experiment: its base config and variants (algo, dropped components, grid
    values). Not its seeds, so a rerun with more ``--seeds`` extends it (seeds 5-9 join a 5-seed
    experiment; 0-4 are not trained again); not the store, the MLflow store, the run folder (paths
    derived from it are written under :data:`FOLDER`) nor how the recipe was named (``alfworld`` or
    ``recipes/alfworld.toml``), so a moved folder or a path typed otherwise finds the same experiment.
    ``legacy``: the spec of milegpo before issue 45, which held all of them and every member's seed."""
    if legacy:
        base = config.to_dict()
        base["run"].update(seed=0, name="")
        return {"base": base, "members": [[m.algo, list(m.drop), m.seed] + ([dict(m.sets)] if m.sets else [])
                                          for m in ms]}
    base = reroot(config, FOLDER).to_dict()
    del base["store"], base["recipe"]
    base["run"].update(seed=0, name="")
    variants: list[list] = []
    for m in ms:
        if (v := variant_spec(m)) not in variants:
            variants.append(v)
    return {"base": base, "variants": variants}


def variant_spec(m: Member) -> list:
    """A member's variant as an experiment's spec lists it: [algo, dropped components(, grid values)]."""
    return [m.algo, list(m.drop)] + ([dict(m.sets)] if m.sets else [])


def experiment_name(config: Config, spec: dict, kind: str = "ablate") -> str:
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    return f"{kind}-{Path(config.recipe).stem or config.env.name}-{digest}"


def member_key(cfg: dict, grid: Sequence[str]) -> tuple:
    """What identifies a member among a store's runs: algo, dropped components, seed and grid values
    (read from a run's stored config, or a member's config)."""
    return (cfg["run"]["algo"], tuple(sorted(cfg["credit"].get("drop") or ())), int(cfg["run"]["seed"]),
            tuple(json.dumps(dotted(cfg, k), sort_keys=True) for k in grid))


def _register(store, tracker, cfg: Config, exp_id: int, parent: str | None) -> int:
    """Create the member's store run and its MLflow child run (train() then resumes both)."""
    from milegpo_cli.trainer.provenance import git_commit, package_versions, run_name

    rid = store.create_run(name=run_name(cfg), algo=cfg.run.algo, seed=cfg.run.seed, recipe=cfg.recipe,
                           config=cfg.to_dict(), drop=cfg.credit.drop, git_commit=git_commit(),
                           versions=package_versions(), experiment_id=exp_id)
    _child_run(store, tracker, cfg, rid, exp_id, parent)
    return rid


def _child_run(store, tracker, cfg: Config, rid: int, exp_id: int, parent: str | None) -> None:
    """Give store run ``rid`` its MLflow child run under ``parent``: the one a command killed during
    registration left unrecorded (found by its tags), else a new one; so no child stays RUNNING forever
    and ``train`` never starts a second, parentless run."""
    from milegpo_cli.trainer.provenance import run_name

    if tracker is None:
        return
    tags = {"milegpo.run_id": rid, "milegpo.experiment_id": exp_id}
    mid = tracker.find_run({**tags, "mlflow.parentRunId": parent}) if parent else None
    if mid is None:
        mid = tracker.start_run(run_name(cfg), params=cfg.to_dict(), parent_run_id=parent, tags=tags)
    store.set_mlflow_run_id(rid, mid)


def _status_table(store, rows: list[tuple[Member, int]], title: str) -> RichTable:
    t = RichTable(title=title)
    for c in ("member", "run", "status", "iterations", "last train success"):
        t.add_column(c)
    by_id = {r["id"]: r for r in store.list_runs()}
    for m, rid in rows:
        r = by_id.get(rid, {})
        ls = r.get("last_success_rate")
        t.add_row(m.label, str(rid), r.get("status", "?"), str(r.get("iterations", 0)), "-" if ls is None else f"{ls:.3f}")
    return t


def run_ablate(config: Config, store, tracker_uri: str | None, drops: Sequence[str] | None, seeds: int, console,
               algos: Sequence[str] | None = None, parallel: int = 1, ray=None) -> int:
    """Run (or resume) the ablation experiment of ``config``; returns its experiment id. ``ray``: a
    ray_dispatch.RayOptions to train the members on a Ray cluster."""
    ms = members(config, drops, seeds, algos)
    ablated = list(DEFAULT_ABLATIONS if drops is None else drops)
    params = {"ablate": {"drops": ablated, "seeds": seeds, "algos": list(algos or ()), "recipe": config.recipe}}
    return run_experiment(config, store, tracker_uri, ms, "ablate", params, console, parallel, ray)


def run_experiment(config: Config, store, tracker_uri: str | None, ms: Sequence[Member], kind: str, params: dict,
                   console, parallel: int = 1, ray=None) -> int:
    """Register (or find) the experiment of members ``ms`` and train those not finished; returns its id."""
    from milegpo_cli.store.tracking import Tracker

    if parallel < 1:
        raise ExperimentError(f"parallel: must be >= 1, got {parallel}")
    if ray is not None and parallel > 1:
        raise ExperimentError("--parallel and --ray exclude each other (Ray runs as many members as the cluster holds)")
    dispatch = _connect(ray, store, tracker_uri or config.store.mlflow_uri, config.store.root, config.run.threads)
    try:
        spec = spec_of(config, ms)
        name = experiment_name(config, spec, kind)
        try:
            exp = _find_experiment(store, name, experiment_name(config, spec_of(config, ms, legacy=True), kind))
            console.print(f"resuming experiment {exp['id']} ({exp['name']})")
        except RunNotFound:
            exp = _same_base(store, spec) if kind == "ablate" else None
            if exp is None:
                exp = store.get_experiment(store.create_experiment_once(name, kind=kind, recipe=config.recipe,
                                                                        config=spec))
                console.print(f"experiment {exp['id']} ({name}): {len(ms)} members")
            else:
                added = dict.fromkeys(m.variant for m in ms if variant_spec(m) not in exp["config"]["variants"])
                console.print(f"extending experiment {exp['id']} ({exp['name']}) with {', '.join(added)}")
        exp_id, name = exp["id"], exp["name"]
        lock = ExperimentLock(store, exp_id).acquire()  # a second command of this experiment stops here
        try:
            _record_variants(store, exp_id, spec)
            return _run_locked(config, store, tracker_uri, ms, params, console, parallel, ray, dispatch, kind, exp,
                               name)
        finally:
            lock.release()
    finally:
        if dispatch is not None:
            dispatch.disconnect()


def _run_locked(config: Config, store, tracker_uri: str | None, ms: Sequence[Member], params: dict, console,
                parallel: int, ray, dispatch, kind: str, exp: dict, name: str) -> int:
    """:func:`run_experiment` once it holds the experiment's lock: MLflow parent, members, training."""
    from milegpo_cli.store.tracking import Tracker

    exp_id = exp["id"]
    tracker = Tracker(tracker_uri) if tracker_uri else None
    parent = exp.get("mlflow_run_id")
    if tracker is not None and not parent:  # the one a killed command left unrecorded, else a new one
        parent = tracker.find_run({"milegpo.experiment_id": exp_id, "milegpo.experiment": name}) or \
            tracker.start_run(name, params=params, tags={"milegpo.experiment_id": exp_id, "milegpo.experiment": name})
        store.set_experiment_mlflow_run_id(exp_id, parent)

    grid = sorted({k for m in ms for k, _ in m.sets})
    existing = {member_key(r["config"], grid): r for r in store.list_runs(exp_id)}
    plan: list[tuple[Member, int]] = []
    done = set()
    for m in ms:
        cfg = member_config(config, m)
        row = existing.get(member_key(cfg.to_dict(), grid))
        rid = row["id"] if row else _register(store, tracker, cfg, exp_id, parent)
        if row and not row.get("mlflow_run_id"):  # registration cut by a kill -9
            _child_run(store, tracker, cfg, rid, exp_id, parent)
        plan.append((m, rid))
        if row and row["status"] == "finished":
            done.add(rid)
    todo = [(m, rid) for m, rid in seed_major(plan) if rid not in done]
    console.print(f"{len(plan) - len(todo)} finished, {len(todo)} to train")

    killed = functools.partial(_member_killed, store, tracker)
    try:
        if dispatch is not None:
            failed = dispatch.train_members(store, todo, config.run.threads, ray, console, killed)
        else:
            failed = local_dispatch.train_members(store, todo, parallel, console, tracker_uri,
                                                  functools.partial(member_config, config), killed)
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP (cli.main): members were stopped and marked killed
        if tracker is not None:
            tracker.run_id = parent
            tracker.end("KILLED")
        raise ExperimentStopped(exp_id, name) from None
    console.print(_status_table(store, plan, f"experiment {exp_id}: {name}"))
    if tracker is not None:
        tracker.run_id = parent
        tracker.end("FAILED" if failed else "FINISHED")
    if failed:
        raise ExperimentError(f"{kind}: {len(failed)} member(s) failed: {', '.join(failed)}; "
                              "rerun the same command to resume")
    return exp_id


def _member_killed(store, tracker, rid: int) -> bool:
    """A stopped member whose ``train`` is dead (SIGKILLed after the stop grace, its Ray worker killed):
    if its run is still ``running``, mark it killed in the store, release its lock and end its MLflow
    run KILLED, so that a rerun resumes it. True when it was marked."""
    if not release_killed(store, rid):
        return False
    mlflow_id = store.get_run(rid).get("mlflow_run_id")
    if tracker is not None and mlflow_id:
        tracker.run_id = mlflow_id
        tracker.end("KILLED")
    return True


def _same_base(store, spec: dict) -> dict | None:
    """The oldest ablate experiment whose base config is ``spec``'s: a command that adds variants
    (ablations, baselines) to an experiment extends it, as more ``--seeds`` do, and trains only the new
    members (a sweep's grid keys are part of its identity: its runs are told apart by their values)."""
    base = json.dumps(spec["base"], sort_keys=True)
    return next((e for e in store.list_experiments() if e["kind"] == "ablate"
                 and json.dumps((e["config"] or {}).get("base"), sort_keys=True) == base), None)


def _record_variants(store, exp_id: int, spec: dict) -> None:
    """Add to the experiment's stored spec the variants of ``spec`` it lacks (a command that extends it)."""
    stored = store.get_experiment(exp_id)["config"] or {}
    if "variants" in stored and (new := [v for v in spec["variants"] if v not in stored["variants"]]):
        store.set_experiment_config(exp_id, {**stored, "variants": stored["variants"] + new})


def _find_experiment(store, name: str, legacy_name: str) -> dict:
    """The experiment of this name, else one an older milegpo named from the spec with its folder."""
    try:
        return store.get_experiment(name)
    except RunNotFound:
        return store.get_experiment(legacy_name)


def _connect(ray, store, mlflow_uri: str, runs_dir: str, threads: int):
    """The ray_dispatch module, joined to the cluster, with the shared folders checked and room for a
    member of ``threads`` cores found before any member is registered (None without ``ray``)."""
    if ray is None:
        return None
    from milegpo_cli.experiments import ray_dispatch

    ray_dispatch.connect(ray.address)
    try:
        ray_dispatch.check_shared(ray.address, store.url, mlflow_uri, runs_dir)
        ray_dispatch.capacity(threads, ray.gpus)
    except BaseException:
        ray_dispatch.disconnect()
        raise
    return ray_dispatch
