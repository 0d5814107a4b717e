"""`milegpo rollout`: evaluate a stored run's checkpoint on fixed tasks, store the evaluation and
optionally record the rollouts (docs/rollouts.md)."""
from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from envs.faults import fault_point
from milegpo_cli.config import Config
from milegpo_cli.errors import MilegpoError
from milegpo_cli.run_folder import relative_to_folder, reroot
from milegpo_cli.trainer.builders import build_policy, build_suite, make_accelerator
from milegpo_cli.trainer.checkpoint import Checkpoint, check_owner, find_checkpoint, list_checkpoints
from milegpo_cli.trainer.episode_records import episode_record, to_rollout
from milegpo_cli.trainer.evaluation import run_evaluation
from milegpo_cli.trainer.resume import checkpoint_root
from milegpo_cli.trainer.seeding import derive_seed
from milegpo_cli.trainer.threads import plan_threads

READ_TRIES = 3  # reads of the newest checkpoint while a training run prunes them


def read_checkpoint(config: Config, run_id: int, iteration: int | None, device, console) -> tuple[Checkpoint, Any]:
    """Checkpoint ``iteration`` (the newest when None) and its policy. A run still training prunes
    its older checkpoints (``checkpoint.keep``): when the newest disappears while it is read, the
    then-newest is read instead and the console says so (at most twice)."""
    root = checkpoint_root(config, run_id)
    for attempt in range(READ_TRIES):
        listed = list_checkpoints(root)
        try:
            ckpt = find_checkpoint(root, iteration)
            if fault_point("rollout.checkpoint_read"):  # test-only: the trainer prunes it now (envs/faults.py)
                shutil.rmtree(ckpt.path)
            return ckpt, build_policy(config, None, device, ckpt.policy_dir)
        except (MilegpoError, OSError) as err:
            if iteration is not None or not listed or listed[-1][1].exists() or attempt == READ_TRIES - 1:
                raise
            console.print(f"[yellow]run {run_id}: checkpoint {listed[-1][0]} was removed while it was read (its "
                          f"training run prunes old checkpoints; {' '.join(str(err).split())[:120]}); reading the "
                          "newest again[/yellow]", soft_wrap=True)


def evaluate(store, run_id: int | str, split: str, episodes: int, checkpoint: int | None = None,
             record_path: str | Path | None = None, console=None, root: str | Path | None = None) -> dict[str, float]:
    """Evaluate a stored run's checkpoint on ``episodes`` fixed tasks of ``split``; store the
    evaluation; with ``record_path`` write the rollouts in the interchange format (docs/rollouts.md).
    ``root``: the run folder in use (run_folder.py), None: the stored one."""
    from rich.console import Console

    from milegpo_cli.interchange import write_rollouts

    console = console or Console()
    row = store.get_run(run_id)
    rid, config = int(row["id"]), reroot(Config.from_dict(row["config"]), root)
    if episodes < 1:
        raise ValueError(f"episodes: must be >= 1, got {episodes}")
    check_owner(checkpoint_root(config, rid), row.get("mlflow_run_id"))
    threads = plan_threads(config)
    threads.apply()
    ckpt, policy = read_checkpoint(config, rid, checkpoint, make_accelerator(config).device, console)
    suite = build_suite(config, threads.rollout.workers)
    venv = suite.make_vector_env(min(episodes, 32), oracle=True)
    try:
        metrics, played = run_evaluation(config, policy, venv, suite, split, episodes,
                                         seed=derive_seed(config.run.seed, "rollout", ckpt.iteration, split),
                                         threads=threads)
    finally:
        venv.close()
        suite.close()
    store.record_evaluation(rid, split, metrics, [episode_record(e) for e in played], iteration=ckpt.iteration,
                            checkpoint=relative_to_folder(ckpt.path, config.store.root), phase="train")
    if record_path is not None:
        write_rollouts(record_path, [replace(to_rollout(e, ckpt.iteration), group=e.task.task_id, rollout_id=0) for e in played])
    console.print(f"run {rid} checkpoint {ckpt.iteration}: {split} success {metrics['success_rate']:.3f} "
                  f"(score {metrics['mean_outcome']:.3f}) over {len(played)} episodes")
    return metrics
