"""The ``milegpo runs`` group (list, ``show``, ``backup``, ``import-mlflow``) and ``milegpo ui`` (the MLflow
UI on the project's tracking store)."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from milegpo_cli.commands.common import (DbOpt, JsonOpt, MlflowOpt, RunArg, RunsDirOpt, command, console, open_store,
                                         print_json)
from milegpo_cli.config import default_db_url, default_tracking_uri
from milegpo_cli.errors import StoreError

runs_app = typer.Typer(help="List runs, or show one (`runs show RUN`).", invoke_without_command=True,
                       rich_markup_mode=None)


@runs_app.callback()
@command
def runs_list(ctx: typer.Context, as_json: JsonOpt = False, db: DbOpt = None, runs_dir: RunsDirOpt = None) -> None:
    """List the runs of the store."""
    if ctx.invoked_subcommand is not None:
        return
    from milegpo_cli.experiments.runs import list_doc, list_table

    try:
        doc = list_doc(open_store(db, runs_dir, reader=True))
    except StoreError as err:
        if not str(err).startswith("no store at"):  # a folder without a store lists nothing (creating nothing)
            raise
        typer.echo(f"{err}: no runs yet", err=True)
        doc = []
    print_json(doc) if as_json else console.print(list_table(doc))


@runs_app.command("show")
@command
def runs_show(run: RunArg, as_json: JsonOpt = False, db: DbOpt = None, runs_dir: RunsDirOpt = None) -> None:
    """Show a run: its fields, iterations and evaluations.

    RUN: a run id or name. Evaluation success has a Wilson 95% interval over its episodes.
    """
    from milegpo_cli.experiments.runs import show_doc, show_tables

    doc = show_doc(open_store(db, runs_dir, reader=True), run)
    if as_json:
        print_json(doc)
        return
    for table in show_tables(doc):
        console.print(table)


@runs_app.command("backup")
@command
def runs_backup(dest: Annotated[Path, typer.Argument(metavar="DEST", hidden=True)],
                results_only: Annotated[bool, typer.Option(
                    "--results-only", help="Keep what reports read: experiments, finished runs, their iterations and "
                    "evaluations; no training rollouts, steps, candidates, memory, checkpoints or MLflow ids. "
                    "Small enough to commit; an ablate or sweep rerun on it trains only what is missing.")] = False,
                db: DbOpt = None, runs_dir: RunsDirOpt = None) -> None:
    """Copy the SQLite store to DEST, consistent even while runs write to it.

    DEST: a new file. Uses SQLite's backup API; for PostgreSQL use pg_dump.
    """
    from milegpo_cli.store.backup import backup_sqlite

    pages = backup_sqlite(db or default_db_url(runs_dir or "runs"), dest, results_only)
    console.print(f"store copied to {dest} ({pages} pages{', results only' if results_only else ''})")


@runs_app.command("import-mlflow")
@command
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

    console.print(import_mlflow_run(open_store(db, runs_dir, create=True), mlflow_uri, mlflow_run_id, name))


@command
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
