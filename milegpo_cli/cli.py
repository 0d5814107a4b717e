"""The ``milegpo`` command line: the Typer app assembled from the command modules in ``commands/``.

User errors (bad recipe or override, unknown run, malformed rollouts, environment input) are
printed as one red line on stderr with exit code 2 (``commands/common.py``). Engines built elsewhere
are imported inside the commands, so ``milegpo --help`` and ``milegpo runs`` start fast. With
``--json`` a command prints one JSON document on stdout and nothing else there (docs/cli.md). Help is
plain text (``rich_markup_mode=None``): option metavars as written there, every default shown.
"""
from __future__ import annotations

import atexit
import gc
import os
import sys

import typer

from milegpo_cli.commands import experiments, training
from milegpo_cli.commands.prepare import envs_app, policy_app
from milegpo_cli.commands.runs import runs_app, ui
from milegpo_cli.interrupts import install_stop_handlers
from milegpo_cli.relaunch import ensure_cpu_processes

app = typer.Typer(help="MileGPO / GiGPO / GRPO experiments on ALFWorld and WebShop: train, evaluate, "
                       "analyse; runs stored in SQLite and MLflow.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False, rich_markup_mode=None)
for _fn in (training.train, training.rollout, training.credit, experiments.ablate, experiments.sweep,
            experiments.diagnose, experiments.compare, experiments.report, ui):
    app.command()(_fn)
app.add_typer(runs_app, name="runs")
app.add_typer(envs_app, name="envs")
app.add_typer(policy_app, name="policy")


def main() -> None:
    # runs last at exit (atexit is LIFO): the interpreter's final collection over torch, transformers and MLflow
    # took 3.3 s after `train` ended (0.4 s frozen), 60 s for a member starved at a Ray worker's nice 15
    atexit.register(gc.freeze)
    ensure_cpu_processes()
    if not sys.stderr.isatty():  # a log file gets no transformers / huggingface_hub progress bars
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    install_stop_handlers()
    app()
