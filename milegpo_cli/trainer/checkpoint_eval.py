"""`milegpo rollout`: evaluate a stored run's checkpoint on fixed tasks, store the evaluation and
optionally record the rollouts (docs/rollouts.md)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from milegpo_cli.config import Config
from milegpo_cli.run_folder import relative_to_folder, reroot
from milegpo_cli.trainer.builders import build_policy, build_suite, make_accelerator
from milegpo_cli.trainer.checkpoint import check_owner, find_checkpoint
from milegpo_cli.trainer.episode_records import episode_record, to_rollout
from milegpo_cli.trainer.evaluation import run_evaluation
from milegpo_cli.trainer.resume import checkpoint_root
from milegpo_cli.trainer.seeding import derive_seed
from milegpo_cli.trainer.threads import fit_to_cores, set_threads


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
    ckpt = find_checkpoint(checkpoint_root(config, rid), checkpoint)
    set_threads(config.run.threads)
    config = fit_to_cores(config)
    suite = build_suite(config)
    venv = suite.make_vector_env(min(episodes, 32), oracle=True)
    try:
        policy = build_policy(config, suite, make_accelerator(config).device, ckpt.policy_dir)
        metrics, played = run_evaluation(config, policy, venv, suite, split, episodes,
                                         seed=derive_seed(config.run.seed, "rollout", ckpt.iteration, split))
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
