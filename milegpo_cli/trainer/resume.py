"""Starting or resuming a run without losing stored rows (issue 35, docs/reliability.md).

Order of :func:`load_resume` and :func:`open_run`: a run that a live process trains is refused; the
checkpoint to resume is found in the run folder in use and verified;
the MLflow store is reached (a server that does not answer fails fast, before a run is created); the
run is locked (store/locks.py); the MLflow run is started or found. Only then are the rows recorded
after the resumed checkpoint deleted, so a failure at any earlier step leaves the store as it was.
A checkpoint the store records but the folder lacks (a moved or copied folder opened with the wrong
``--runs-dir``) is an error naming both, never a silent restart from iteration 0; so is a checkpoint
folder of another store's run of the same id (trainer/checkpoint.py, ``owner.json``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from milegpo_cli.config import Config
from milegpo_cli.errors import RunStopped
from milegpo_cli.run_folder import reroot, resume_command
from milegpo_cli.store.locks import RunLock, refuse_if_held
from milegpo_cli.trainer.checkpoint import Checkpoint, CheckpointError, check_owner, latest_checkpoint
from milegpo_cli.trainer.distributed import broadcast_object
from milegpo_cli.trainer.evaluation import evaluation_metrics
from milegpo_cli.trainer.provenance import git_commit, package_versions, run_name


def checkpoint_root(config: Config, run_id: int) -> Path:
    return Path(config.store.root) / "checkpoints" / f"run_{run_id}"


def stopped(run_id: int, config: Config, store) -> RunStopped:
    return RunStopped(run_id, resume_command(run_id, config.store.root, store.url))


def checkpoint_to_resume(store, run_id: int, root: Path, owner: str | None) -> Checkpoint | None:
    """The newest complete checkpoint under ``root``, verified; None when the run has none yet.
    CheckpointError when ``root`` is not run ``owner``'s (its MLflow run id), or the store records a
    newer checkpoint than it holds."""
    check_owner(root, owner)
    recorded = store.latest_checkpoint(run_id)  # read first: a trainer records a checkpoint after writing it
    ckpt = latest_checkpoint(root)
    if recorded is not None and (ckpt is None or ckpt.iteration < recorded["iteration"]):
        have = "no checkpoint" if ckpt is None else f"only the checkpoint of iteration {ckpt.iteration}"
        raise CheckpointError(f"run {run_id}: the store records the checkpoint of iteration {recorded['iteration']} "
                              f"but {root} holds {have}: give the run's folder with --runs-dir (nothing was changed)")
    return ckpt


def load_resume(store, resume_run: int | str, root: str | Path) -> tuple[int, Config, Checkpoint | None]:
    """(run id, its stored config re-rooted at ``root``, its verified checkpoint or None). A run that a
    live process trains is refused first (RunLocked): its folder changes while it is read."""
    row = store.get_run(resume_run)
    run_id, config = int(row["id"]), reroot(Config.from_dict(row["config"]), root)
    refuse_if_held(run_id, row["lock_host"], row["lock_pid"], row["lock_heartbeat"])
    return run_id, config, checkpoint_to_resume(store, run_id, checkpoint_root(config, run_id), row.get("mlflow_run_id"))


@dataclass
class OpenedRun:
    run_id: int
    tracker: object | None  # store.tracking.Tracker on the main process
    lock: RunLock | None
    mlflow_run_id: str | None  # the run's MLflow run id (main process), which owns its checkpoint folder


def logged_metrics(store, run_id: int) -> list[tuple[int, dict]]:
    """(step, metrics) of everything a run logs to MLflow, as its store holds it: each iteration's metrics
    at its step, each evaluation of training (not of ``milegpo rollout``) under its prefix."""
    points = [(row["iteration"], row["metrics"] or {}) for row in store.iterations(run_id)]
    return points + [(e["iteration"], evaluation_metrics(e["split"], e["phase"], e["metrics"] or {}))
                     for e in store.evaluations(run_id) if e["checkpoint"] is None and e["iteration"] is not None]


def create_run(config: Config, store) -> int:
    """Register a new run of ``config`` in the store, with its name, git commit and package versions."""
    return store.create_run(name=run_name(config), algo=config.run.algo, seed=config.run.seed, recipe=config.recipe,
                            config=config.to_dict(), drop=config.credit.drop, git_commit=git_commit(),
                            versions=package_versions())


def open_run(config: Config, store, tracker_uri: str, run_id: int | None, ckpt: Checkpoint | None, main: bool,
             accelerator) -> OpenedRun:
    """Create (``run_id`` None) or resume a run, in the order of the module docstring; the run is then
    ``running`` and locked by this process (main process only; other ranks get the id)."""
    from milegpo_cli.store.tracking import Tracker

    tracker = Tracker(tracker_uri) if main else None
    new = run_id is None
    if new:
        run_id = broadcast_object(create_run(config, store) if main else None, accelerator)
    if not main:
        return OpenedRun(run_id, None, None, None)
    lock = RunLock(store, run_id).acquire()
    try:
        if not new and ckpt is None:  # a registered run (ablate) starts now: it trains wholly under this code
            store.set_provenance(run_id, git_commit(), package_versions())
        row = store.get_run(run_id)
        mlflow_id = row.get("mlflow_run_id")
        if mlflow_id:
            tracker.resume(mlflow_id)
        else:
            versions = row["versions"] or {}  # the stack a figure can be traced to
            mlflow_id = tracker.start_run(run_name(config), params=config.to_dict(), tags={
                "milegpo.run_id": run_id, **{f"version.{k}": v for k, v in versions.items()}})
            store.set_mlflow_run_id(run_id, mlflow_id)
        if not new:
            store.delete_after(run_id, ckpt.iteration if ckpt else -1)
            tracker.backfill(logged_metrics(store, run_id))  # what MLflow missed while its server was away
        store.set_status(run_id, "running")
    except BaseException as err:
        stop = isinstance(err, KeyboardInterrupt)
        if new:
            store.set_status(run_id, "killed" if stop else "failed")
        lock.release()
        if stop:
            raise stopped(run_id, config, store) from err
        raise
    return OpenedRun(run_id, tracker, lock, mlflow_id)
