"""``milegpo ablate`` and ``sweep`` (experiments of several runs, here, in subprocesses or on Ray) and the
readers of stored runs: ``diagnose``, ``compare`` and ``report``."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from milegpo_cli.commands.common import (AlgoOpt, DbOpt, DropOpt, ItersOpt, JsonOpt, MlflowOpt, ModelOpt, RecipeOpt,
                                         RunArg, RunsDirOpt, SetOpt, build_config, check_runs_folder, command, console,
                                         engine_data, fail, json_format, open_store)


SeedsOpt = Annotated[int, typer.Option("--seeds", min=1, metavar="N", help="Seeds per member (0..N-1).")]
ParallelOpt = Annotated[int, typer.Option("--parallel", min=1, metavar="N",
                                          help="Members trained at once, each in its own process.")]
RayOpt = Annotated[Optional[str], typer.Option(
    "--ray", metavar="ADDRESS",
    help="Train the members as Ray tasks on a cluster: auto, HOST:PORT, ray://HOST:10001, or local (a cluster "
         "of this machine's cores); needs the [ray] extra, and a store, MLflow store and --runs-dir every node "
         "sees (docs/scale.md) [default: no Ray].")]
RayGpusOpt = Annotated[float, typer.Option("--ray-gpus", min=0.0, metavar="N", help="GPUs of each member's Ray task.")]


def _ray_options(address: str | None, gpus: float, parallel: int):
    """ray_dispatch.RayOptions for --ray (None without it); Ray itself is imported only when training starts."""
    if address is None:
        if gpus:
            raise fail("--ray-gpus needs --ray", 2)
        return None
    if parallel > 1:
        raise fail("--parallel and --ray exclude each other (Ray runs as many members as the cluster holds)", 2)
    from milegpo_cli.experiments.ablate import RayOptions

    return RayOptions(address, gpus)


def _ray_connect(options) -> None:
    """Join the --ray cluster before the store is created: an address where none answers is one line
    within the connect timeout, and creates nothing (experiments/ray_dispatch.py)."""
    if options is not None:
        from milegpo_cli.experiments.ray_dispatch import connect

        connect(options.address)


@command
def ablate(recipe: RecipeOpt = "alfworld", sets: SetOpt = None, drop: DropOpt = None,
           seeds: SeedsOpt = 3, algo: AlgoOpt = None, model: ModelOpt = None, iterations: ItersOpt = None, db: DbOpt = None,
           mlflow_uri: MlflowOpt = None, runs_dir: RunsDirOpt = None,
           baselines: Annotated[Optional[list[str]], typer.Option(
               "--baseline", metavar="ALGO",
               help="Baseline algorithm trained as extra members (repeatable): grpo, gigpo, graphgpo, hgpo; "
                    "gigpo, graphgpo and hgpo run their verl-agent recipes (credit.preset) [default: none].")] = None,
           parallel: ParallelOpt = 1, ray: RayOpt = None, ray_gpus: RayGpusOpt = 0.0,
           ablations: Annotated[bool, typer.Option(
               "--ablations/--no-ablations",
               help="Train the --drop ablations (default: every component); --no-ablations trains the full "
                    "method (and --baseline members) only.")] = True) -> None:
    """Ablate MileGPO components over seeds, as one experiment.

    Trains the full method, each --drop ablation and each --baseline over seeds; rerun the same
    command to resume it.
    """
    if drop and not ablations:
        raise typer.BadParameter("--drop and --no-ablations exclude each other", param_hint="--drop")
    ray_options = _ray_options(ray, ray_gpus, parallel)
    config = build_config(recipe, sets, algo, None, model, iterations, None, db, mlflow_uri, runs_dir)
    check_runs_folder(config)
    engine_data(config.store.root)
    _ray_connect(ray_options)
    from milegpo_cli.experiments.ablate import run_ablate

    run_ablate(config, open_store(config.store.db, runs_dir, create=True), config.store.mlflow_uri,
               (drop or None) if ablations else [], seeds, console,
               algos=baselines or None, parallel=parallel, ray=ray_options)


@command
def sweep(grid: Annotated[list[str], typer.Option(
              "--grid", metavar="SECTION.KEY=V1,V2,...",
              help="A config key and its values (TOML values, as --set); repeatable: the variants are every "
                   "combination.")],
          recipe: RecipeOpt = "alfworld", sets: SetOpt = None, seeds: SeedsOpt = 3, algo: AlgoOpt = None,
          model: ModelOpt = None, iterations: ItersOpt = None, drop: DropOpt = None, db: DbOpt = None,
          mlflow_uri: MlflowOpt = None, runs_dir: RunsDirOpt = None, parallel: ParallelOpt = 1, ray: RayOpt = None,
          ray_gpus: RayGpusOpt = 0.0,
          yes: Annotated[bool, typer.Option("--yes", help="Go on with a grid of more than 500 members.")] = False) -> None:
    """Sweep config values over seeds, as one experiment.

    Trains every combination of the --grid values over seeds; rerun the same command to resume it.
    `milegpo report --experiment ID` ranks the variants (--metric).
    """
    ray_options = _ray_options(ray, ray_gpus, parallel)
    config = build_config(recipe, sets, algo, None, model, iterations, drop, db, mlflow_uri, runs_dir)
    check_runs_folder(config)
    from milegpo_cli.experiments.sweep import run_sweep, sweep_grid

    sweep_grid(config, grid, seeds, yes)  # before the store is created: a refused grid creates nothing
    engine_data(config.store.root)
    _ray_connect(ray_options)
    run_sweep(config, open_store(config.store.db, runs_dir, create=True), config.store.mlflow_uri, grid, seeds,
              console, parallel=parallel, ray=ray_options, yes=yes)


@command
def diagnose(run: RunArg,
             iteration: Annotated[Optional[int], typer.Option(
                 "--iteration", metavar="K",
                 help="Iteration of the candidates; also restricts the credit diagnostics to it "
                      "[default: candidates of the last, diagnostics over all].")] = None,
             fmt: Annotated[str, typer.Option("--format", metavar="table|json", help="Output format.")] = "table",
             as_json: JsonOpt = False,
             out: Annotated[Optional[Path], typer.Option(
                 "--out", metavar="DIR", help="Folder for plots [default: <runs-dir>/diagnose/run<ID>].")] = None,
             db: DbOpt = None, runs_dir: RunsDirOpt = None) -> None:
    """Milestones, traps and credit diagnostics of a stored run.

    RUN: a run id or name. Credit diagnostics: ROC-AUC, sign accuracy and milestone precision /
    recall of the advantages against the oracle labels.
    """
    fmt = json_format(fmt, as_json)
    from milegpo_cli.experiments.diagnose import run_diagnose

    run_diagnose(open_store(db, runs_dir, reader=True), run, iteration, fmt, out, console)


@command
def compare(refs: Annotated[list[str], typer.Argument(metavar="RUN...", hidden=True)],
            out: Annotated[Optional[Path], typer.Option(
                "--out", metavar="DIR", help="Folder for learning-curve plots [default: <runs-dir>/compare].")] = None,
            as_json: JsonOpt = False, db: DbOpt = None, runs_dir: RunsDirOpt = None) -> None:
    """Side-by-side table and learning curves of runs or experiments.

    RUN...: run ids or names, or experiments (exp:<id|name>, or a name that is no run).
    """
    from milegpo_cli.experiments.compare import run_compare

    run_compare(open_store(db, runs_dir, reader=True), refs, out, console, fmt=json_format("table", as_json))


@command
def report(experiment: Annotated[Optional[str], typer.Option(
               "--experiment", metavar="EXPERIMENT", help="Experiment id or name [default: all runs].")] = None,
           by: Annotated[str, typer.Option("--by", metavar="algo|drop", help="Group runs by algo or drop.")] = "algo",
           fmt: Annotated[str, typer.Option("--format", metavar="table|md|csv|json|html", help="Output format.")] = "table",
           as_json: JsonOpt = False,
           baseline: Annotated[Optional[str], typer.Option(
               "--baseline", metavar="METHOD",
               help="Method for probability of improvement [default: gigpo, else grpo; full with --by drop].")] = None,
           metric: Annotated[Optional[str], typer.Option(
               "--metric", metavar="METRIC",
               help="Rank the methods (a sweep's variants) by success_id, success_ood, score_id, score_ood or auc_id, "
                    "the best against each other [default: success_id for a sweep, else no ranking].")] = None,
           out: Annotated[Optional[Path], typer.Option(
               "--out", metavar="DIR", help="Folder for plots [default: <runs-dir>/report/<experiment id or all>].")] = None,
           mde: Annotated[Optional[float], typer.Option(
               "--mde", metavar="POINTS",
               help="For each comparison against the baseline, the paired seeds whose minimum detectable "
                    "difference of the id area would be POINTS (points of success) at the observed spread "
                    "[default: none].")] = None,
           db: DbOpt = None, runs_dir: RunsDirOpt = None) -> None:
    """Seed and variance tables of the runs of an experiment.

    Per method and split: success over the final evaluation's episodes, mean ± std over seeds with
    a 95% CI; IQM, ID-to-OOD gap and probability of improvement over a baseline.
    """
    fmt = json_format(fmt, as_json)
    from milegpo_cli.experiments.report import run_report

    run_report(open_store(db, runs_dir, reader=True), experiment, by, fmt, baseline, out, console, metric, mde)
