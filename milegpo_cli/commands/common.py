"""What every command shares: one red line for a user error (exit 2), the stopped-run and
stopped-experiment messages (exit 128 + the signal), the stores a command opened closed at its end,
the shared options and the helpers that build a command's config and store."""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer
from rich.console import Console

from envs.base import EnvError
from milegpo_cli.config import Config, default_db_url, load_config
from milegpo_cli.errors import ExperimentStopped, MilegpoError, RunStopped
from milegpo_cli.interrupts import stop_exit_code

console = Console(soft_wrap=not sys.stdout.isatty())  # a log file: one message per line, not wrapped at 80 columns

opened_stores: list = []  # closed when the command ends: a SQLite store's WAL is folded into its file


def fail(message: str, code: int) -> typer.Exit:
    typer.secho(f"error: {' '.join(message.split())}", fg="red", err=True)
    return typer.Exit(code)


def command(fn: Callable) -> Callable:
    """User errors -> one red line on stderr, exit 2; a stopped run -> one line with the command that
    resumes it, exit 128 + the signal. The stores the command opened are closed at its end (RunStore.close)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (MilegpoError, EnvError) as err:
            raise fail(str(err) or type(err).__name__, 2) from None
        except RunStopped as err:
            typer.secho(f"run {err.run_id} stopped (marked killed); resume it with: {err.command}", fg="yellow",
                        err=True)
            raise typer.Exit(stop_exit_code()) from None
        except ExperimentStopped as err:  # exit 128 + the signal: 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP
            typer.secho(f"experiment {err.exp_id} ({err.name}) stopped, its running members marked killed; "
                        "resume it by running the same command again", fg="yellow", err=True)
            raise typer.Exit(stop_exit_code()) from None
        finally:
            while opened_stores:
                opened_stores.pop().close()
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


def print_json(doc: Any) -> None:
    """One JSON document on stdout (strict: NaN / inf are null)."""
    from milegpo_cli.experiments.runs import dumps

    sys.stdout.write(dumps(doc) + "\n")


def build_config(recipe: str, sets: list[str] | None, algo: str | None = None, seed: int | None = None,
                 model: str | None = None, iterations: int | None = None, drop: list[str] | None = None,
                 db: str | None = None, mlflow_uri: str | None = None, runs_dir: Path | None = None) -> Config:
    flags: dict[str, Any] = {"run.algo": algo, "run.seed": seed, "policy.model": model, "run.iterations": iterations,
                             "credit.drop": drop or None, "store.db": db, "store.mlflow_uri": mlflow_uri,
                             "store.root": None if runs_dir is None else str(runs_dir)}
    return load_config(recipe, sets or [], flags)


def engine_data(root: str | Path) -> None:
    """ALFWorld's data folder inside the run directory (importing alfworld creates it)."""
    os.environ.setdefault("ALFWORLD_DATA", str(Path(root).resolve() / "alfworld_data"))


def open_store(db: str | None, runs_dir: Path | None, *, create: bool = False, reader: bool = False):
    """The run store. Only ``create`` (a new training run, ablate) makes one where there is none;
    a ``reader`` opens a store it cannot write read-only (store/database.py)."""
    from milegpo_cli.store import RunStore

    store = RunStore(db or default_db_url(runs_dir or "runs"), create=create, reader=reader)
    opened_stores.append(store)
    return store


def check_runs_folder(config: Config) -> None:
    """The run folder of a command that writes there, checked before the work (creating nothing)."""
    from milegpo_cli.outputs import check_folder

    check_folder(config.store.root, "--runs-dir")


def json_format(fmt: str, as_json: bool) -> str:
    """--json is --format json; with another --format it is a usage error."""
    if as_json and fmt not in ("table", "json"):
        raise fail(f"--json and --format {fmt} exclude each other", 2)
    return "json" if as_json else fmt
