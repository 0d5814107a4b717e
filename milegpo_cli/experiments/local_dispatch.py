"""Members of an experiment trained on this machine (``milegpo ablate/sweep``, ``--parallel N``).

With ``parallel`` 1 each member trains in this process (``train(resume_run=...)``); above, each in a
``milegpo train --resume RUN`` subprocess of its own session, at most ``parallel`` at a time, with
its share of this process's cores (milegpo_cli/cores.py) and its log in ``<root>/logs/run<ID>.log``.
Interrupted (Ctrl-C, SIGTERM, SIGHUP), the running members get SIGTERM and mark their runs killed; one
still there after the grace period (interrupts.stop_grace) is SIGKILLed and its run marked killed here.
ray_dispatch.py runs the same subprocesses as Ray tasks; what to train and in which order is
experiments/ablate.py's.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from milegpo_cli.cores import CORES_ENV, member_share, process_cores
from milegpo_cli.interrupts import stop_grace


def train_members(store, todo: list[tuple[Any, int]], parallel: int, console, tracker_uri: str | None,
                  config_of: Callable[[Any], Any], killed: Callable[[int], bool]) -> list[str]:
    """Train ``todo`` ([(member, run id)], in order) in this process (``config_of(member)``: its
    config) or in ``parallel`` subprocesses; returns the failures. ``killed(run id)`` marks the run of
    a subprocess SIGKILLed when the command was stopped."""
    from milegpo_cli.trainer.loop import train

    if parallel > 1:
        return _train_parallel(store, todo, parallel, console, killed)
    failed: list[str] = []
    for m, rid in todo:
        console.print(f"[bold]member {m.label}[/bold] (run {rid})")
        try:
            train(config_of(m), store, tracker_uri, resume_run=rid, console=console)
        except Exception as err:  # noqa: BLE001 - one failed member must not stop the others
            console.print(f"[red]member {m.label} (run {rid}) failed: {err}[/red]")
            failed.append(f"{m.label} (run {rid}: {type(err).__name__}: {err})")
    return failed


def _train_parallel(store, todo: list[tuple[Any, int]], parallel: int, console,
                    killed: Callable[[int], bool]) -> list[str]:
    """``milegpo train --resume RUN`` subprocesses, at most ``parallel`` at a time; logs beside the store.
    Interrupted (Ctrl-C, SIGTERM), it stops the running members, which mark their runs killed."""
    grace = stop_grace()
    running: list[tuple[Any, int, subprocess.Popen, object]] = []
    try:
        return _supervise(store, list(todo), running, parallel, console)
    except BaseException:
        _stop(running, console, killed, grace)
        raise


def _stop(running: list[tuple[Any, int, subprocess.Popen, object]], console, killed: Callable[[int], bool],
          grace: float) -> None:
    """SIGTERM every running member (``milegpo train`` treats it as Ctrl-C); SIGKILL those still there
    after ``grace`` seconds (one deadline for all), then mark their runs killed (``killed``)."""
    for _, _, proc, _ in running:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace
    late = []
    for _, rid, proc, _ in running:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            late.append(rid)
    for m, rid, proc, log in running:
        proc.wait()
        log.close()
        marked = rid in late and killed(rid)
        console.print(f"stopped {m.label} (run {rid}), exit {proc.returncode}"
                      + (f": killed after {grace:g} s, marked killed" if marked else ""))


def _supervise(store, queue: list[tuple[Any, int]], running: list, parallel: int, console) -> list[str]:
    """Keep ``parallel`` members running until ``queue`` is empty; returns the failures."""
    failed: list[str] = []
    while queue or running:
        while queue and len(running) < parallel:
            m, rid = queue.pop(0)
            row = store.get_run(rid)
            log_dir = Path((row["config"].get("store") or {}).get("root") or "runs") / "logs"
            log_dir.mkdir(parents=True, exist_ok=True)
            log = open(log_dir / f"run{rid}.log", "ab")
            cmd = [sys.executable, "-m", "milegpo_cli", "train", "--resume", str(rid), "--db", store.url]
            # its own session: a Ctrl-C reaches this process only, and :func:`_stop` signals each member once;
            # its share of this process's cores (milegpo_cli/cores.py)
            env = {**os.environ, CORES_ENV: str(member_share(process_cores(), parallel))}
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
            running.append((m, rid, proc, log))
            console.print(f"started {m.label} (run {rid}), log {log.name}")
        time.sleep(1.0)
        for item in list(running):
            m, rid, proc, log = item
            if proc.poll() is not None:
                log.close()
                running.remove(item)
                if proc.returncode != 0:
                    failed.append(f"{m.label} (run {rid}: exit {proc.returncode}, see {log.name})")
                console.print(f"{m.label} (run {rid}) exited {proc.returncode}")
    return failed
