"""Several CPU processes under ``accelerate launch --cpu --num_processes K`` (issue 18, docs/scale.md).

accelerate (1.16) starts K CPU processes only through mpirun (``--mpirun_hostfile``). Without it, its
simple launcher starts ONE process and leaves only MASTER_ADDR / MASTER_PORT behind, so K > 1 would
silently train on one process. :func:`requested_cpu_processes` recognises that case from the
environment and the launcher's own command line; :func:`relaunch` then re-executes the same command
under ``torch.distributed.run`` with K local processes, which accelerate runs as MULTI_CPU (gloo).
It runs before any command: it reads only the environment unless accelerate's CPU flag is set,
and imports accelerate only to parse the launcher's command line.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Mapping, Sequence

# Set by torchrun, mpirun or MVAPICH: a process that has them already is one of several.
_RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def _launch_args(parent_argv: Sequence[str]):
    """The parsed options of an ``accelerate launch`` command line, or None if it is not one."""
    for i, arg in enumerate(parent_argv):
        if arg == "launch" or arg.endswith("accelerate.commands.launch"):
            from accelerate.commands.launch import launch_command_parser

            try:
                return launch_command_parser().parse_args(list(parent_argv[i + 1:]))
            except SystemExit:
                return None
    return None


def requested_cpu_processes(environ: Mapping[str, str], parent_argv: Sequence[str]) -> int:
    """K when this process is the only one accelerate's simple launcher started for ``--cpu
    --num_processes K`` (K > 1) on one machine; 1 otherwise."""
    if environ.get("ACCELERATE_USE_CPU", "").lower() not in ("true", "1", "yes"):
        return 1
    if "MASTER_ADDR" not in environ or any(v in environ for v in _RANK_VARS):
        return 1
    args = _launch_args(parent_argv)
    if args is None or (args.num_machines or 1) > 1:
        return 1
    return max(1, int(args.num_processes or 1))


def parent_argv() -> list[str]:
    """The parent process's command line (Linux /proc; empty where it cannot be read)."""
    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def relaunch(k: int, environ: Mapping[str, str]) -> None:
    """Replace this process by ``torch.distributed.run`` running the same milegpo command K times."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(k),
           "--master_addr", environ["MASTER_ADDR"], "--master_port", environ.get("MASTER_PORT", "29500"),
           "-m", "milegpo_cli", *sys.argv[1:]]
    sys.stdout.flush()
    os.execv(sys.executable, cmd)


def ensure_cpu_processes() -> None:
    """Relaunch with K CPU processes when accelerate started one for ``--cpu --num_processes K``."""
    if "ACCELERATE_USE_CPU" not in os.environ:
        return
    k = requested_cpu_processes(os.environ, parent_argv())
    if k > 1:
        print(f"accelerate --cpu started 1 of {k} processes; relaunching {k} CPU processes (gloo)",
              file=sys.stderr)
        relaunch(k, os.environ)
