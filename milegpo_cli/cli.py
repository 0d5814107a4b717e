"""The ``milegpo`` command line: thin Typer commands over config, store, trainer and experiments.

User errors (bad recipe or override, unknown run, malformed rollouts, environment input) are
printed as one red line on stderr with exit code 2. Engines built elsewhere are imported inside
the commands, so ``milegpo --help`` and ``milegpo runs`` start fast. With ``--json`` a command
prints one JSON document on stdout and nothing else there (docs/cli.md). Help is plain text
(``rich_markup_mode=None``): option metavars as written here, every default shown.
"""
from __future__ import annotations

import functools
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer
from rich.console import Console

from envs.base import EnvError
from milegpo_cli.config import Config, credit_overrides, default_db_url, default_tracking_uri, load_config
from milegpo_cli.errors import ExperimentStopped, MilegpoError, RunStopped, StoreError
from milegpo_cli.relaunch import ensure_cpu_processes
from milegpo_cli.run_folder import command_root, reroot

app = typer.Typer(help="MileGPO / GiGPO / GRPO experiments on ALFWorld and WebShop: train, evaluate, "
                       "analyse; runs stored in SQLite and MLflow.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False, rich_markup_mode=None)
runs_app = typer.Typer(help="List runs, or show one (`runs show RUN`).", invoke_without_command=True,
                       rich_markup_mode=None)
envs_app = typer.Typer(help="Environment data: generate ALFWorld games.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(runs_app, name="runs")
app.add_typer(envs_app, name="envs")
policy_app = typer.Typer(help="Starting policies: build the cached base policy.", no_args_is_help=True,
                         rich_markup_mode=None)
app.add_typer(policy_app, name="policy")
console = Console(soft_wrap=not sys.stdout.isatty())  # a log file: one message per line, not wrapped at 80 columns

def _fail(message: str, code: int) -> typer.Exit:
    typer.secho(f"error: {' '.join(message.split())}", fg="red", err=True)
    return typer.Exit(code)


_opened_stores: list = []  # closed when the command ends: a SQLite store's WAL is folded into its file


def _command(fn: Callable) -> Callable:
    """User errors -> one red line on stderr, exit 2; a stopped run -> one line with the command that
    resumes it, exit 130. The stores the command opened are closed at its end (RunStore.close)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (MilegpoError, EnvError) as err:
            raise _fail(str(err) or type(err).__name__, 2) from None
        except RunStopped as err:
            typer.secho(f"run {err.run_id} stopped (marked killed); resume it with: {err.command}", fg="yellow",
                        err=True)
            raise typer.Exit(130) from None
        except ExperimentStopped as err:  # exit 128 + the signal: 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP
            typer.secho(f"experiment {err.exp_id} ({err.name}) stopped, its running members marked killed; "
                        "resume it by running the same command again", fg="yellow", err=True)
            raise typer.Exit(128 + _stop_signal[-1]) from None
        finally:
            while _opened_stores:
                _opened_stores.pop().close()
    return wrapper


# --- shared options ------------------------------------------------------------------------------
RecipeOpt = Annotated[str, typer.Option("--recipe", "-r", metavar="NAME|PATH",
                                        help="Recipe name in recipes/ or a path to a TOML file.")]
SetOpt = Annotated[Optional[list[str]], typer.Option(
    "--set", "-s", metavar="SECTION.KEY=VALUE", help="Override a recipe key (TOML value, else a string); repeatable [default: none].")]
AlgoOpt = Annotated[Optional[str], typer.Option(
    "--algo", metavar="ALGO", help="Credit estimator: grpo, gigpo, graphgpo, milegpo, hgpo [default: the recipe's run.algo].")]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", metavar="INT", help="Run seed [default: the recipe's run.seed].")]
ModelOpt = Annotated[Optional[str], typer.Option(
    "--model", metavar="MODEL", help="'tiny', a Hugging Face name or a local folder [default: the recipe's policy.model].")]
ItersOpt = Annotated[Optional[int], typer.Option(
    "--iterations", metavar="N", help="Training iterations [default: the recipe's run.iterations].")]
DropOpt = Annotated[Optional[list[str]], typer.Option(
    "--drop", metavar="COMPONENT", help="Ablate a MileGPO component: reliability, progress, same-state, traps, "
                                        "milestones, memory (credit.memory); repeatable [default: none].")]
DbOpt = Annotated[Optional[str], typer.Option(
    "--db", envvar="MILEGPO_DB", metavar="URL",
    help="SQLAlchemy URL or SQLite path of the run store [default: <runs-dir>/milegpo.db].")]
MlflowOpt = Annotated[Optional[str], typer.Option(
    "--mlflow-uri", envvar="MILEGPO_MLFLOW_URI", metavar="URI",
    help="MLflow tracking URI [default: sqlite:///<runs-dir>/mlflow.db].")]
RunsDirOpt = Annotated[Optional[Path], typer.Option(
    "--runs-dir", envvar="MILEGPO_RUNS_DIR", metavar="DIR", help="Run directory (store.root) [default: runs].")]
RunArg = Annotated[str, typer.Argument(metavar="RUN", hidden=True)]  # hidden: described in the docstring
JsonOpt = Annotated[bool, typer.Option(
    "--json", help="Print one JSON document on stdout and nothing else there (docs/cli.md).")]


def _print_json(doc: Any) -> None:
    """One JSON document on stdout (strict: NaN / inf are null)."""
    from milegpo_cli.experiments.runs import dumps

    sys.stdout.write(dumps(doc) + "\n")


def _config(recipe: str, sets: list[str] | None, algo: str | None = None, seed: int | None = None,
            model: str | None = None, iterations: int | None = None, drop: list[str] | None = None,
            db: str | None = None, mlflow_uri: str | None = None, runs_dir: Path | None = None) -> Config:
    flags: dict[str, Any] = {"run.algo": algo, "run.seed": seed, "policy.model": model, "run.iterations": iterations,
                             "credit.drop": drop or None, "store.db": db, "store.mlflow_uri": mlflow_uri,
                             "store.root": None if runs_dir is None else str(runs_dir)}
    return load_config(recipe, sets or [], flags)


def _engine_data(root: str | Path) -> None:
    """ALFWorld's data folder inside the run directory (importing alfworld creates it)."""
    os.environ.setdefault("ALFWORLD_DATA", str(Path(root).resolve() / "alfworld_data"))


def _store(db: str | None, runs_dir: Path | None, *, create: bool = False, reader: bool = False):
    """The run store. Only ``create`` (a new training run, ablate) makes one where there is none;
    a ``reader`` opens a store it cannot write read-only (store/database.py)."""
    from milegpo_cli.store import RunStore

    store = RunStore(db or default_db_url(runs_dir or "runs"), create=create, reader=reader)
    _opened_stores.append(store)
    return store


def _runs_folder(config: Config) -> None:
    """The run folder of a command that writes there, checked before the work (creating nothing)."""
    from milegpo_cli.outputs import check_folder

    check_folder(config.store.root, "--runs-dir")


def _json_format(fmt: str, as_json: bool) -> str:
    """--json is --format json; with another --format it is a usage error."""
    if as_json and fmt not in ("table", "json"):
        raise _fail(f"--json and --format {fmt} exclude each other", 2)
    return "json" if as_json else fmt


def _refuse_stored_options(ctx: typer.Context, run_id: int, config: Config, iterations: int | None) -> None:
    """``train --resume`` continues with the run's stored config: an option that it fixes is refused in
    one line, never ignored (--iterations: unless it equals the stored count)."""
    given = [p for p in ctx.command.params if p.name in ("recipe", "sets", "algo", "seed", "model", "drop")
             and getattr(ctx.get_parameter_source(p.name), "name", None) in ("COMMANDLINE", "ENVIRONMENT")]
    if given:
        raise _fail(f"--resume: {given[0].opts[0]} cannot be given: run {run_id} continues with its stored config "
                    "(only --db, --mlflow-uri and --runs-dir may change)", 2)
    if iterations is not None and iterations != config.run.iterations:
        raise _fail(f"--resume: --iterations {iterations} cannot be given: run {run_id} trains "
                    f"{config.run.iterations} iterations (its stored config); extending a run is not supported, "
                    "train a new run to train longer", 2)


# --- training and evaluation ---------------------------------------------------------------------
@app.command()
@_command
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
            raise _fail("--dry-run and --resume exclude each other", 2)
        from milegpo_cli.trainer.plan import describe

        typer.echo(describe(_config(recipe, sets, algo, seed, model, iterations, drop, db, mlflow_uri, runs_dir)))
        return
    if resume is None:
        config = _config(recipe, sets, algo, seed, model, iterations, drop, db, mlflow_uri, runs_dir)
        _runs_folder(config)
        store, resume_id = _store(config.store.db, runs_dir, create=True), None
    else:  # the stored config, in the run folder in use (the folder may have been moved: run_folder.py)
        store = _store(db, runs_dir)
        run = store.get_run(resume)
        resume_id, config = run["id"], reroot(Config.from_dict(run["config"]), command_root(runs_dir, db))
        _refuse_stored_options(ctx, resume_id, config, iterations)
    _engine_data(config.store.root)
    from milegpo_cli.store.tracking import probe_server

    probe_server(mlflow_uri or config.store.mlflow_uri)  # in seconds, before the trainer loads (docs/reliability.md)
    from milegpo_cli.trainer.loop import train as train_run

    run_id = train_run(config, store, mlflow_uri or config.store.mlflow_uri, resume_id, console)
    store.quick_check()  # a store damaged under the run is said now (docs/reliability.md)
    console.print(f"run {run_id} done  (milegpo runs show {run_id})")


@app.command()
@_command
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
    store = _store(db, runs_dir)
    if record is not None:  # checked before the evaluation is played
        from milegpo_cli.outputs import OutputFile

        OutputFile(record, "--record", {"the store": store.file})
    root = command_root(runs_dir, db)
    _engine_data(reroot(Config.from_dict(store.get_run(run)["config"]), root).store.root)
    from milegpo_cli.trainer.checkpoint_eval import evaluate

    evaluate(store, store.get_run(run)["id"], split, episodes, checkpoint, record, console, root=root)


@app.command()
@_command
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
        raise _fail("credit: give the rollouts file once, as INPUT or as --input FILE", 2)
    from milegpo_cli.interchange import run_credit_file

    summary = run_credit_file(input_arg or input_opt, output, algo, drop or [], credit_overrides(sets or []), milestones)
    for warning in summary.pop("warnings", ()):
        typer.secho(f"warning: {warning}", fg="yellow", err=True)
    console.print(summary)


# --- experiments ---------------------------------------------------------------------------------
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
            raise _fail("--ray-gpus needs --ray", 2)
        return None
    if parallel > 1:
        raise _fail("--parallel and --ray exclude each other (Ray runs as many members as the cluster holds)", 2)
    from milegpo_cli.experiments.ablate import RayOptions

    return RayOptions(address, gpus)


def _ray_connect(options) -> None:
    """Join the --ray cluster before the store is created: an address where none answers is one line
    within the connect timeout, and creates nothing (experiments/ray_dispatch.py)."""
    if options is not None:
        from milegpo_cli.experiments.ray_dispatch import connect

        connect(options.address)


@app.command()
@_command
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
    config = _config(recipe, sets, algo, None, model, iterations, None, db, mlflow_uri, runs_dir)
    _runs_folder(config)
    _engine_data(config.store.root)
    _ray_connect(ray_options)
    from milegpo_cli.experiments.ablate import run_ablate

    run_ablate(config, _store(config.store.db, runs_dir, create=True), config.store.mlflow_uri, (drop or None) if ablations else [],
               seeds, console,
               algos=baselines or None, parallel=parallel, ray=ray_options)


@app.command()
@_command
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
    config = _config(recipe, sets, algo, None, model, iterations, drop, db, mlflow_uri, runs_dir)
    _runs_folder(config)
    _engine_data(config.store.root)
    _ray_connect(ray_options)
    from milegpo_cli.experiments.sweep import run_sweep

    run_sweep(config, _store(config.store.db, runs_dir, create=True), config.store.mlflow_uri, grid, seeds, console,
              parallel=parallel, ray=ray_options, yes=yes)


@app.command()
@_command
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
    fmt = _json_format(fmt, as_json)
    from milegpo_cli.experiments.diagnose import run_diagnose

    run_diagnose(_store(db, runs_dir, reader=True), run, iteration, fmt, out, console)


@app.command()
@_command
def compare(refs: Annotated[list[str], typer.Argument(metavar="RUN...", hidden=True)],
            out: Annotated[Optional[Path], typer.Option(
                "--out", metavar="DIR", help="Folder for learning-curve plots [default: <runs-dir>/compare].")] = None,
            as_json: JsonOpt = False, db: DbOpt = None, runs_dir: RunsDirOpt = None) -> None:
    """Side-by-side table and learning curves of runs or experiments.

    RUN...: run ids or names, or experiments (exp:<id|name>, or a name that is no run).
    """
    from milegpo_cli.experiments.compare import run_compare

    run_compare(_store(db, runs_dir, reader=True), refs, out, console, fmt=_json_format("table", as_json))


@app.command()
@_command
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
    fmt = _json_format(fmt, as_json)
    from milegpo_cli.experiments.report import run_report

    run_report(_store(db, runs_dir, reader=True), experiment, by, fmt, baseline, out, console, metric, mde)


# --- runs, ui, envs ------------------------------------------------------------------------------
@runs_app.callback()
@_command
def runs_list(ctx: typer.Context, as_json: JsonOpt = False, db: DbOpt = None, runs_dir: RunsDirOpt = None) -> None:
    """List the runs of the store."""
    if ctx.invoked_subcommand is not None:
        return
    from milegpo_cli.experiments.runs import list_doc, list_table

    try:
        doc = list_doc(_store(db, runs_dir, reader=True))
    except StoreError as err:
        if not str(err).startswith("no store at"):  # a folder without a store lists nothing (creating nothing)
            raise
        typer.echo(f"{err}: no runs yet", err=True)
        doc = []
    _print_json(doc) if as_json else console.print(list_table(doc))


@runs_app.command("show")
@_command
def runs_show(run: RunArg, as_json: JsonOpt = False, db: DbOpt = None, runs_dir: RunsDirOpt = None) -> None:
    """Show a run: its fields, iterations and evaluations.

    RUN: a run id or name. Evaluation success has a Wilson 95% interval over its episodes.
    """
    from milegpo_cli.experiments.runs import show_doc, show_tables

    doc = show_doc(_store(db, runs_dir, reader=True), run)
    if as_json:
        _print_json(doc)
        return
    for table in show_tables(doc):
        console.print(table)


@runs_app.command("backup")
@_command
def runs_backup(dest: Annotated[Path, typer.Argument(metavar="DEST", hidden=True)], db: DbOpt = None,
                runs_dir: RunsDirOpt = None) -> None:
    """Copy the SQLite store to DEST, consistent even while runs write to it.

    DEST: a new file. Uses SQLite's backup API; for PostgreSQL use pg_dump.
    """
    from milegpo_cli.store.backup import backup_sqlite

    pages = backup_sqlite(db or default_db_url(runs_dir or "runs"), dest)
    console.print(f"store copied to {dest} ({pages} pages)")


@runs_app.command("import-mlflow")
@_command
def runs_import_mlflow(mlflow_run_id: Annotated[str, typer.Argument(metavar="RUN_ID", hidden=True)],
                       mlflow_uri: Annotated[str, typer.Option(
                           "--from", metavar="URI", envvar="MLFLOW_TRACKING_URI",
                           help="Tracking URI verl logged to (its MLFLOW_TRACKING_URI).")] = ...,
                       name: Annotated[Optional[str], typer.Option("--name", metavar="NAME",
                                                                   help="Run name [default: the MLflow run's].")] = None,
                       db: DbOpt = None, runs_dir: RunsDirOpt = None) -> None:
    """Import a run that verl logged to MLflow (its per-step metrics), so `runs` and `compare` see it.

    RUN_ID: the MLflow run id (docs/scale.md, "MileGPO in verl").
    """
    from milegpo_cli.integrations.verl.mlflow_runs import import_mlflow_run

    console.print(import_mlflow_run(_store(db, runs_dir, create=True), mlflow_uri, mlflow_run_id, name))


@app.command()
@_command
def ui(host: Annotated[str, typer.Option("--host", metavar="HOST",
                                         help="Address to bind; 0.0.0.0 exposes it to the network.")] = "127.0.0.1",
       port: Annotated[int, typer.Option("--port", metavar="PORT", help="Port.")] = 5000,
       mlflow_uri: MlflowOpt = None, runs_dir: RunsDirOpt = None) -> None:
    """Start the MLflow UI on the project's tracking store."""
    uri = mlflow_uri or default_tracking_uri(runs_dir or "runs")
    console.print(f"MLflow UI on http://{host}:{port} for {uri} (Ctrl-C stops it)")
    sys.stdout.flush()
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # a file store given by --mlflow-uri
    # exec, not a child process: Ctrl-C and SIGTERM reach mlflow, which stops its workers
    os.execv(sys.executable, [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
                              "--host", host, "--port", str(port)])


@envs_app.command("generate")
@_command
def envs_generate(env: Annotated[str, typer.Option("--env", metavar="ENV", help="Environment (alfworld).")] = "alfworld",
                  split: Annotated[str, typer.Option("--split", metavar="SPLIT", help="train, id or ood.")] = "train",
                  n: Annotated[int, typer.Option("-n", min=1, metavar="N", help="Number of games.")] = 100,
                  recipe: Annotated[Optional[str], typer.Option(
                      "--recipe", "-r", metavar="NAME|PATH", help="Recipe [default: the --env name].")] = None,
                  sets: SetOpt = None, runs_dir: RunsDirOpt = None) -> None:
    """Generate ALFWorld games (PDDL + traj_data) of a split with the real engine's assets.

    The games go to env.alfworld.data_dir (default <runs-dir>/alfworld), as `train` reads them.
    """
    if env != "alfworld":
        raise _fail(f"--env: only 'alfworld' has games to generate, got {env!r}", 2)
    config = _config(recipe or env, sets, runs_dir=runs_dir)
    _runs_folder(config)
    _engine_data(config.store.root)  # before the engine's import, which creates ALFWORLD_DATA
    from rich.progress import Progress

    from envs.alfworld import generate_games

    with Progress(console=console) as bar:
        task = bar.add_task(f"alfworld {split}", total=n)
        result = generate_games(config.env.alfworld, split, n, lambda done, total: bar.update(task, completed=done))
    console.print(f"generated {len(result) if hasattr(result, '__len__') else n} games ({split})")


@policy_app.command("build-base")
@_command
def policy_build_base(recipe: RecipeOpt = "alfworld", sets: SetOpt = None, runs_dir: RunsDirOpt = None) -> None:
    """Build (once) the recipe's cached base policy.

    The base policy is the supervised starting point of PPO (recipe section [base]).
    """
    config = _config(recipe, sets, runs_dir=runs_dir)
    _runs_folder(config)
    _engine_data(config.store.root)
    from milegpo_cli.trainer.base_policy import build_for_recipe

    folder, metrics = build_for_recipe(config, console.print)
    console.print(f"base policy {folder}: " + "  ".join(f"{k} {v:.4g}" for k, v in metrics.items()))


_stop_signal = [signal.SIGINT]  # the signal that stopped the command (Ctrl-C unless a handler below says otherwise)


def _sigterm_as_interrupt(signum, frame) -> None:
    """SIGTERM (``kill``, a scheduler, ``milegpo ablate`` stopping its members) and SIGHUP (the terminal
    closed) end a command as Ctrl-C does: a run is marked killed in the store and MLflow. Later ones
    are ignored so that the cleanup finishes."""
    signal.signal(signum, signal.SIG_IGN)
    _stop_signal.append(signum)
    raise KeyboardInterrupt


def main() -> None:
    ensure_cpu_processes()
    if not sys.stderr.isatty():  # a log file gets no transformers / huggingface_hub progress bars
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # nohup: stays ignored
        signal.signal(signal.SIGHUP, _sigterm_as_interrupt)
    app()
