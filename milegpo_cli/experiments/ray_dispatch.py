"""Members of an experiment as Ray tasks (``milegpo ablate/sweep --ray ADDRESS``).

Each member runs as one Ray task that starts the same ``milegpo train --resume RUN`` subprocess as
``--parallel`` does, on whichever node Ray places it (``num_cpus`` = the member's ``run.threads``,
``num_gpus`` = ``--ray-gpus``). Members are pre-registered in the store before any task starts, so a
task only ever resumes a run: a member whose task dies (its worker or ``train`` process killed, its
node lost) is submitted again, resuming from its last checkpoint, at most ``RETRIES`` times; it is
never trained twice as two runs. The ``train`` process dies with the task's worker (Linux
``PR_SET_PDEATHSIG``), so a retried member never overlaps its previous attempt. At most as many
members run as the cluster has room for, taken in the experiment's seed-by-seed order (a retried
member goes first).

Every node must see the store, the MLflow store and the runs folder: :func:`check_shared` asks each
node before anything starts. This module imports Ray; import it only when ``--ray`` is given.
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable, Sequence

from sqlalchemy.engine import make_url

from milegpo_cli.experiments.runs import ExperimentError
from milegpo_cli.cores import CORES_ENV
from milegpo_cli.interrupts import stop_grace

try:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ModuleNotFoundError as err:  # the [ray] extra is not installed
    raise ExperimentError("--ray needs Ray: pip install 'milegpo[ray]'") from err

LOCAL = "local"  # --ray local: a one-node cluster of this machine's cores, started and stopped here
RETRIES = 3  # resubmissions of a member whose task died
LOCAL_OBJECT_STORE = 128 * 2**20  # members exchange return codes only
PASSED_ENV = ("ALFWORLD_DATA", "PYTHONPATH")  # the driver's paths, valid on every node of a shared folder
PASSED_PREFIX = "MILEGPO_"
STOP_MARGIN_S = 10.0  # a cancelled task kills its train at the grace; the driver waits the grace and this long
FORCE_WAIT_S = 30.0  # for a force-cancelled task's worker to die (its train dies with it)
POLL_S = 0.5  # a member's task looks at its ``train`` this often: a cancel (Ctrl-C of the driver) lands between looks
CONNECT_TIMEOUT_ENV = "MILEGPO_RAY_CONNECT_TIMEOUT"  # seconds; docs/scale.md
CONNECT_TIMEOUT_S = 30.0
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + an empty SETTINGS frame
SETTINGS_FRAME = 4


def connect_timeout() -> float:
    """``MILEGPO_RAY_CONNECT_TIMEOUT`` (seconds, default 30)."""
    text = os.environ.get(CONNECT_TIMEOUT_ENV, "")
    try:
        value = float(text) if text else CONNECT_TIMEOUT_S
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ExperimentError(f"{CONNECT_TIMEOUT_ENV}={text!r}: must be a number of seconds > 0")
    return value


def probe(address: str, timeout: float) -> None:
    """Refuse (one line) a ``HOST:PORT`` where no Ray GCS answers, before anything is created: the port
    must accept a connection within ``timeout`` and answer an HTTP/2 preface with a SETTINGS frame, as
    the GCS's gRPC server does (ray.init would otherwise retry a closed port or an HTTP server for
    minutes). ``auto``, ``local`` and ``ray://`` addresses are left to ray.init."""
    host, sep, port = address.rpartition(":")
    if "://" in address or not sep or not port.isdigit():
        return
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout) as conn:
            conn.settimeout(timeout)
            conn.sendall(HTTP2_PREFACE)
            head = conn.recv(64)
    except TimeoutError:
        found = f"no answer within {timeout:g} s ({CONNECT_TIMEOUT_ENV})"
    except OSError as err:
        found = err.strerror or type(err).__name__
    else:
        if len(head) >= 9 and head[3] == SETTINGS_FRAME:
            return
        first = " ".join(head.splitlines()[0].decode("ascii", "replace").split())[:40] if head.strip() else ""
        found = f"a server that is not Ray's (it answered {first!r})" if first else "a server that is not Ray's"
    raise ExperimentError(f"--ray {address}: no Ray cluster there: {found}; give the head node's GCS address "
                          "(ray start --head prints it) or local")


def connect(address: str) -> None:
    """Join the cluster at ``address`` (``local``: start one on this machine's cores) within
    :func:`connect_timeout`. ray.init's own SIGTERM handler is replaced by the one it found, so that
    SIGTERM stops the members as Ctrl-C does. Ray still prints the cluster's error messages about this
    driver's tasks (``(raylet) A worker died ...``, whatever ``log_to_driver``); when stdout is no
    terminal they carry no colour codes (``RAY_COLOR_PREFIX=0``, read by Ray as it prints)."""
    if ray.is_initialized():
        return
    timeout = connect_timeout()
    probe(address, timeout)
    if not sys.stdout.isatty():
        os.environ["RAY_COLOR_PREFIX"] = "0"
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        if address == LOCAL:
            ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, object_store_memory=LOCAL_OBJECT_STORE,
                     log_to_driver=False, logging_level=logging.WARNING)
        else:  # no INFO lines of Ray's in the driver's output, no workers' logs (each member has its own)
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise ExperimentError(f"--ray {address}: cannot reach the cluster: {' '.join(str(err).split())}") from None
    finally:
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)


def shared_paths(store_url: str, mlflow_uri: str, runs_dir: str | Path) -> dict[str, Path]:
    """what -> absolute folder that every node must see: the runs folder, a SQLite store's folder, a
    file MLflow store (server URLs need nothing)."""
    out = {"--runs-dir": Path(runs_dir).resolve()}
    url = make_url(store_url)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        out["--db (a SQLite store)"] = Path(url.database).resolve().parent
    scheme, _, rest = mlflow_uri.partition(":")
    if not rest:  # a bare path is a file store
        out["--mlflow-uri (a file store)"] = Path(mlflow_uri).resolve()
    elif scheme == "file":
        out["--mlflow-uri (a file store)"] = Path("/" + rest.lstrip("/")).resolve()
    elif scheme == "sqlite":
        out["--mlflow-uri (a SQLite store)"] = Path(rest[3:]).resolve().parent
    return out


def unseen(paths: dict[str, Path], answers: dict[str, tuple[str, set[str]]]) -> list[str]:
    """'<what> <folder> is not seen by node <ip> (<node id>)' for every folder a node did not find
    (``answers``: node id -> (its ip, the folders it found); keyed by id, as several nodes may share an ip)."""
    return [f"{what} {folder} is not seen by node {ip} ({node[:12]})" for node, (ip, found) in sorted(answers.items())
            for what, folder in paths.items() if str(folder) not in found]


def _found(markers: Sequence[str]) -> tuple[str, tuple[str, set[str]]]:
    return (ray.get_runtime_context().get_node_id(),
            (ray.util.get_node_ip_address(), {str(Path(m).parent) for m in markers if os.path.exists(m)}))


def check_shared(address: str, store_url: str, mlflow_uri: str, runs_dir: str | Path) -> None:
    """Refuse (ExperimentError, one line) a store, MLflow store or runs folder that some alive node
    does not see: a marker file is written in each folder here and looked for on every node. A
    ``local`` cluster is this machine: nothing to check."""
    if address == LOCAL:
        return
    paths = shared_paths(store_url, mlflow_uri, runs_dir)
    tag = f".milegpo-ray-check-{uuid.uuid4().hex}"
    markers = []
    try:
        for folder in paths.values():
            folder.mkdir(parents=True, exist_ok=True)
            markers.append(str(folder / tag))
            Path(markers[-1]).touch()
        probe = ray.remote(num_cpus=0)(_found)
        refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(markers)
                for n in ray.nodes() if n["Alive"]]
        answers = dict(ray.get(refs, timeout=120))
    finally:
        for m in markers:
            Path(m).unlink(missing_ok=True)
    missing = unseen(paths, answers)
    if missing:
        raise ExperimentError(f"--ray {address}: {missing[0]}; use a PostgreSQL store (--db postgresql://...), "
                              "an MLflow server (--mlflow-uri http://...) and a runs folder every node mounts")


def _die_with_parent() -> None:
    """In the ``train`` child: SIGKILL when the task's worker dies (Linux), so no attempt outlives its task."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _member(cmd: list[str], env: dict[str, str], cwd: str, log_path: str, attempt: int, grace: float) -> int | str:
    """The Ray task of a member: ``milegpo train --resume RUN`` on this node; its return code (a
    string: the working or log folder this node does not see, so ``train`` never started). A
    cancelled task (Ctrl-C of the driver) stops ``train`` as SIGTERM does: the run is marked killed;
    a ``train`` still there after ``grace`` seconds is killed (the driver then marks its run).
    ``train`` joins this cluster (``RAY_ADDRESS``) for engine actors (env.alfworld.workers_backend)."""
    full = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, **env}
    for folder in (cwd, os.path.dirname(os.path.join(cwd, log_path))):
        if not os.path.isdir(folder):  # every attempt here would fail alike: no retry (train_members)
            return f"folder {folder} is not seen by node {ray.util.get_node_ip_address()}"
    # ray.cancel interrupts a running task with _thread.interrupt_main(), which does nothing while SIGINT is
    # ignored, as in the workers of a cluster started by a background job (`cmd &`, nohup, CI): the cancel was
    # lost and the member stopped only when force-cancelled, 70 s later
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _run_train(cmd, full, cwd, log_path, attempt, grace)
    finally:
        if previous is not None:  # None: not set from Python, cannot be put back
            signal.signal(signal.SIGINT, previous)


def _run_train(cmd: list[str], env: dict[str, str], cwd: str, log_path: str, attempt: int, grace: float) -> int:
    """:func:`_member`'s ``train`` subprocess, polled so that a KeyboardInterrupt (the task cancelled) stops it
    as SIGTERM does, SIGKILL after ``grace`` seconds."""
    with open(os.path.join(cwd, log_path), "ab") as log:
        proc = subprocess.Popen([sys.executable, *cmd], stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env,
                                preexec_fn=_die_with_parent, start_new_session=True)
        try:
            log.write(f"[ray] attempt {attempt}: node {ray.util.get_node_ip_address()}, task worker pid {os.getpid()}, "
                      f"train pid {proc.pid}\n".encode())
            log.flush()
            while True:  # not one blocking wait: the KeyboardInterrupt of ray.cancel must find Python code running
                try:
                    return proc.wait(timeout=POLL_S)
                except subprocess.TimeoutExpired:
                    pass
        except KeyboardInterrupt:
            proc.terminate()
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise


def capacity(cpus: float, gpus: float) -> int:
    """Members the cluster's alive nodes can run at once with these resources each (a member runs on one node)."""
    def fits(have: dict) -> int:
        n = [have.get("CPU", 0.0) // cpus if cpus else 1_000, have.get("GPU", 0.0) // gpus if gpus else 1_000]
        return int(min(n))

    n = sum(fits(node["Resources"]) for node in ray.nodes() if node["Alive"])
    if n < 1:
        raise ExperimentError(f"--ray: no node has room for a member ({cpus:g} CPUs = run.threads, {gpus:g} GPUs = "
                              "--ray-gpus)")
    return n


def train_members(store, todo: list, threads: int, options, console, killed: Callable[[int], bool]) -> list[str]:
    """Train ``todo`` ([(member, run id)], in order) as Ray tasks (``options``: ablate.RayOptions); returns the failures. A task that
    died is resubmitted (``train --resume``) up to ``RETRIES`` times; a ``train`` that failed is not. Interrupted,
    the running members are stopped (:func:`stop`; ``killed(run id)``: marks a run whose ``train`` was killed)."""
    grace = stop_grace()
    task = ray.remote(_member).options(num_cpus=threads, num_gpus=options.gpus, max_retries=0)
    slots = capacity(threads, options.gpus)
    env = {CORES_ENV: str(threads), **{k: v for k, v in os.environ.items()
                                       if k in PASSED_ENV or k.startswith(PASSED_PREFIX)}}
    queue = [(m, rid, 1) for m, rid in todo]
    running: dict = {}
    failed: list[str] = []
    try:
        while queue or running:
            while queue and len(running) < slots:
                m, rid, attempt = queue.pop(0)
                root = (store.get_run(rid)["config"].get("store") or {}).get("root") or "runs"
                log = Path(root) / "logs" / f"run{rid}.log"
                log.parent.mkdir(parents=True, exist_ok=True)
                cmd = ["-m", "milegpo_cli", "train", "--resume", str(rid), "--db", store.url]
                running[task.remote(cmd, env, os.getcwd(), str(log), attempt, grace)] = (m, rid, attempt, log)
                console.print(f"submitted {m.label} (run {rid}, attempt {attempt}), log {log}")
            done, _ = ray.wait(list(running), num_returns=1, timeout=2.0)
            for ref in done:
                m, rid, attempt, log = running.pop(ref)
                try:
                    code, why = ray.get(ref), ""
                except ray.exceptions.RayError as err:  # worker or node died, task cancelled
                    code, why = None, type(err).__name__
                if isinstance(code, str):  # a folder this node does not see: each attempt would fail alike
                    failed.append(f"{m.label} (run {rid}: {code})")
                    console.print(f"[red]{m.label} (run {rid}) failed: {code}[/red]")
                    continue
                status = store.get_run(rid)["status"]
                if code == 0 and status == "finished":
                    console.print(f"{m.label} (run {rid}) finished")
                    continue
                died = code is None or code < 0 or status in ("killed", "running")
                why = why or (f"killed by signal {-code}" if code < 0 else f"exit {code}")
                if died and attempt <= RETRIES:
                    console.print(f"[yellow]{m.label} (run {rid}) died ({why}); resuming it from its last checkpoint "
                                  f"(attempt {attempt + 1})[/yellow]")
                    queue.insert(0, (m, rid, attempt + 1))
                else:
                    failed.append(f"{m.label} (run {rid}: {why}, see {log})")
                    console.print(f"[red]{m.label} (run {rid}) failed: {why}[/red]")
    except BaseException:
        stop(running, console, killed, grace)
        raise
    return failed


def stop(running: dict, console, killed: Callable[[int], bool], grace: float) -> None:
    """Cancel the running members: each ``train`` gets SIGTERM and marks its run killed, or is killed by
    its task after ``grace`` seconds; a task still there then is force-cancelled (its worker dies, and
    its ``train`` with it). Every member whose task ended is passed to ``killed``, which marks its run
    killed if its ``train`` could not (a run left ``running`` would stay so, its lock held)."""
    refs = list(running)
    for ref in refs:
        ray.cancel(ref)
    _, left = ray.wait(refs, num_returns=len(refs), timeout=grace + STOP_MARGIN_S)
    for ref in left:
        ray.cancel(ref, force=True)
    ended, _ = ray.wait(refs, num_returns=len(refs), timeout=FORCE_WAIT_S)
    for ref in refs:
        m, rid, _, _ = running[ref]
        if ref not in ended:  # its node does not answer: the run's lock goes stale after store/locks.STALE_S
            console.print(f"[red]{m.label} (run {rid}) did not stop: its run stays running until its lock goes stale"
                          "[/red]")
        elif killed(rid):
            console.print(f"stopped {m.label} (run {rid}): killed after {grace:g} s, marked killed")
        else:
            console.print(f"stopped {m.label} (run {rid})")


def disconnect() -> None:
    """Leave the cluster (a ``local`` one stops)."""
    if ray.is_initialized():
        ray.shutdown()
