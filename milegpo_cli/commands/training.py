"""``milegpo train``, ``rollout`` and ``credit``: a training run, the evaluation of a stored checkpoint,
and advantages for rollouts from elsewhere."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from milegpo_cli.commands.common import (AlgoOpt, DbOpt, DropOpt, ItersOpt, MlflowOpt, ModelOpt, RecipeOpt,
                                         RunsDirOpt, SeedOpt, SetOpt, build_config, check_runs_folder, command,
                                         console, engine_data, fail, open_store)
from milegpo_cli.config import Config, credit_overrides
from milegpo_cli.run_folder import command_root, reroot


def _refuse_stored_options(ctx: typer.Context, run_id: int, config: Config, iterations: int | None) -> None:
    """``train --resume`` continues with the run's stored config: an option that it fixes is refused in
    one line, never ignored (--iterations: unless it equals the stored count)."""
    given = [p for p in ctx.command.params if p.name in ("recipe", "sets", "algo", "seed", "model", "drop")
             and getattr(ctx.get_parameter_source(p.name), "name", None) in ("COMMANDLINE", "ENVIRONMENT")]
    if given:
        raise fail(f"--resume: {given[0].opts[0]} cannot be given: run {run_id} continues with its stored config "
                   "(only --db, --mlflow-uri and --runs-dir may change)", 2)
    if iterations is not None and iterations != config.run.iterations:
        raise fail(f"--resume: --iterations {iterations} cannot be given: run {run_id} trains "
                   f"{config.run.iterations} iterations (its stored config); extending a run is not supported, "
                   "train a new run to train longer", 2)


# --- training and evaluation ---------------------------------------------------------------------
@command
def train(ctx: typer.Context, recipe: RecipeOpt = "alfworld", sets: SetOpt = None, algo: AlgoOpt = None, seed: SeedOpt = None,
          model: ModelOpt = None, iterations: ItersOpt = None, drop: DropOpt = None, db: DbOpt = None,
          mlflow_uri: MlflowOpt = None, runs_dir: RunsDirOpt = None,
          resume: Annotated[Optional[str], typer.Option("--resume", metavar="RUN",
                            help="Continue RUN from its last checkpoint (its stored config is used) "
                                 "[default: start a new run].")] = None,
          dry_run: Annotated[bool, typer.Option(
              "--dry-run", help="Print the resolved plan (model, parameter count, memory per GPU, batch sizes, "
                                "tokens per iteration) without loading weights or writing anything.")] = False) -> None:
    """Train a policy with the recipe's credit estimator.

    Every iteration goes to the store and MLflow; `milegpo runs show RUN` prints them.
    """
    if dry_run:
        if resume is not None:
            raise fail("--dry-run and --resume exclude each other", 2)
        from milegpo_cli.trainer.plan import describe

        typer.echo(describe(build_config(recipe, sets, algo, seed, model, iterations, drop, db, mlflow_uri, runs_dir)))
        return
    if resume is None:
        config = build_config(recipe, sets, algo, seed, model, iterations, drop, db, mlflow_uri, runs_dir)
        check_runs_folder(config)
        store, resume_id = open_store(config.store.db, runs_dir, create=True), None
    else:  # the stored config, in the run folder in use (the folder may have been moved: run_folder.py)
        store = open_store(db, runs_dir)
        run = store.get_run(resume)
        resume_id, config = run["id"], reroot(Config.from_dict(run["config"]), command_root(runs_dir, db))
        _refuse_stored_options(ctx, resume_id, config, iterations)
    engine_data(config.store.root)
    from milegpo_cli.store.tracking import probe_server

    probe_server(mlflow_uri or config.store.mlflow_uri)  # in seconds, before the trainer loads (docs/reliability.md)
    from milegpo_cli.trainer.loop import train as train_run

    run_id = train_run(config, store, mlflow_uri or config.store.mlflow_uri, resume_id, console)
    store.quick_check()  # a store damaged under the run is said now (docs/reliability.md)
    console.print(f"run {run_id} done  (milegpo runs show {run_id})")


@command
def rollout(run: Annotated[str, typer.Option("--run", metavar="RUN", help="Run id or name.")],
            split: Annotated[str, typer.Option("--split", metavar="SPLIT", help="Task split: id, ood (or train).")] = "id",
            episodes: Annotated[int, typer.Option("--episodes", "-n", min=1, metavar="N", help="Episodes to play.")] = 16,
            checkpoint: Annotated[Optional[int], typer.Option(
                "--checkpoint", metavar="ITERATION", help="Iteration of the checkpoint [default: the latest].")] = None,
            record: Annotated[Optional[Path], typer.Option(
                "--record", metavar="FILE",
                help="Also write the rollouts as JSON Lines (docs/rollouts.md) [default: not written].")] = None,
            db: DbOpt = None, runs_dir: RunsDirOpt = None) -> None:
    """Evaluate a trained policy on a split and store the evaluation."""
    store = open_store(db, runs_dir)
    if record is not None:  # checked before the evaluation is played
        from milegpo_cli.outputs import OutputFile

        OutputFile(record, "--record", {"the store": store.file})
    root = command_root(runs_dir, db)
    engine_data(reroot(Config.from_dict(store.get_run(run)["config"]), root).store.root)
    from milegpo_cli.trainer.checkpoint_eval import evaluate

    evaluate(store, store.get_run(run)["id"], split, episodes, checkpoint, record, console, root=root)


@command
def credit(input_arg: Annotated[Optional[str], typer.Argument(
               metavar="INPUT", exists=True, dir_okay=False, allow_dash=True, hidden=True)] = None,
           input_opt: Annotated[Optional[str], typer.Option(  # str: typer drops allow_dash for a Path
               "--input", "-i", metavar="FILE", exists=True, dir_okay=False, allow_dash=True,
               help="Rollouts, JSON Lines (docs/rollouts.md), or - for standard input [default: the INPUT argument].")] = None,
           output: Annotated[Path, typer.Option("--output", "-o", metavar="FILE", help="Per-step advantages, JSON Lines.")] = ...,
           algo: Annotated[str, typer.Option("--algo", metavar="ALGO", help=(
               "grpo, gigpo, graphgpo, milegpo, hgpo or oracle-milestones (needs steps[t].subgoals)."))] = "milegpo",
           drop: DropOpt = None,
           sets: Annotated[Optional[list[str]], typer.Option(
               "--set", "-s", metavar="[credit.]KEY=VALUE",
               help="Override a credit setting (milegpo_cli/credit/config.py); repeatable [default: none].")] = None,
           milestones: Annotated[Optional[Path], typer.Option(
               "--milestones", metavar="FILE",
               help="Also write the milestone / trap sets, one JSON document (docs/rollouts.md) "
                    "[default: not written].")] = None) -> None:
    """Advantages of any estimator for rollouts from elsewhere.

    INPUT (or --input FILE): the rollouts, JSON Lines (docs/rollouts.md); - reads standard input.
    """
    if (input_arg is None) == (input_opt is None):
        raise fail("credit: give the rollouts file once, as INPUT or as --input FILE", 2)
    from milegpo_cli.interchange import run_credit_file

    summary = run_credit_file(input_arg or input_opt, output, algo, drop or [], credit_overrides(sets or []), milestones)
    for warning in summary.pop("warnings", ()):
        typer.secho(f"warning: {warning}", fg="yellow", err=True)
    console.print(summary)
