"""One trainer per run (store/locks.py, issue 35): on a real SQLite file and a real PostgreSQL server,
two processes taking one run's lock at once get it once; a live holder is named in the refusal; a lock
left by a dead process (or with a stale heartbeat) is taken over; two `train --resume` of one run
cannot both train."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from sqlalchemy import update

from milegpo_cli.config import load_config
from milegpo_cli.store import RunStore
from milegpo_cli.store import locks
from milegpo_cli.store.locks import RunLock, RunLocked
from milegpo_cli.store.models import Run
from milegpo_cli.trainer.checkpoint import CheckpointError
from milegpo_cli.trainer.resume import load_resume
from test_reliability_crash import SCRIPT, milegpo, models_dir, new_root, train_args  # noqa: F401 (fixture)

HOLDER = textwrap.dedent("""
    import sys, time
    from milegpo_cli.store import RunStore
    from milegpo_cli.store.locks import RunLock, RunLocked
    store = RunStore(sys.argv[1])
    time.sleep(float(sys.argv[2]) - time.time())  # both processes ask at the same moment
    try:
        lock = RunLock(store, 1).acquire()
    except RunLocked as err:
        print("refused:", err, flush=True)
        sys.exit(3)
    print("holding", flush=True)
    time.sleep(float(sys.argv[3]))
    lock.release()
""")


def set_lock(store: RunStore, host: str | None, pid: int | None, heartbeat: float | None) -> None:
    with store.engine.begin() as conn:
        conn.execute(update(Run).where(Run.id == 1).values(lock_host=host, lock_pid=pid, lock_heartbeat=heartbeat))


def lock_row(store: RunStore) -> tuple:
    run = store.get_run(1)
    return run["lock_host"], run["lock_pid"]


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_two_processes_at_once_get_the_lock_once(store_url):
    with RunStore(store_url) as store:
        store.create_run("r", "milegpo")
    at = str(time.time() + 3.0)
    procs = [subprocess.Popen([sys.executable, "-c", HOLDER, store_url, at, "4"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 3], outs
    winner = next(p for p in procs if p.returncode == 0)
    refusal = next(o for p, o in zip(procs, outs) if p.returncode == 3)[0]
    assert f"run 1 is being trained by pid {winner.pid} on host {socket.gethostname()}" in refusal
    with RunStore(store_url) as store:
        assert lock_row(store) == (None, None)  # released by the winner


def test_live_holder_is_refused_dead_or_stale_holder_is_taken_over(store_url):
    with RunStore(store_url) as store:
        store.create_run("r", "milegpo")
        host = socket.gethostname()
        alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            set_lock(store, host, alive.pid, time.time())
            with pytest.raises(RunLocked, match=rf"pid {alive.pid} on host {host} \(heartbeat \d+ s ago\)"):
                RunLock(store, 1).acquire()
            set_lock(store, "other-host", 4242, time.time())  # another machine, fresh heartbeat: alive
            with pytest.raises(RunLocked, match="pid 4242 on host other-host"):
                RunLock(store, 1).acquire()
            set_lock(store, host, alive.pid, time.time() - locks.STALE_S - 5)  # pid reused, heartbeat stale
            with RunLock(store, 1):
                assert lock_row(store) == (host, os.getpid())
            assert lock_row(store) == (None, None)
        finally:
            alive.kill()
            alive.wait()
        for holder in ((host, dead_pid()), ("other-host", 4242)):  # dead here; silent elsewhere for too long
            set_lock(store, *holder, time.time() - (0 if holder[0] == host else locks.STALE_S + 5))
            with RunLock(store, 1):
                assert lock_row(store) == (host, os.getpid())


def test_heartbeat_advances_while_held(store_url, monkeypatch):
    monkeypatch.setattr(locks, "HEARTBEAT_S", 0.2)
    with RunStore(store_url) as store:
        store.create_run("r", "milegpo")
        with RunLock(store, 1):
            first = store.get_run(1)["lock_heartbeat"]
            time.sleep(1.0)
            assert store.get_run(1)["lock_heartbeat"] > first


def test_a_resume_of_a_run_in_training_is_refused_before_its_folder_is_read(store_url, tmp_path):
    """The trainer's folder changes under a second resume (its store records a checkpoint the folder
    listing did not show yet): the lock is checked first, so the refusal names the trainer."""
    with RunStore(store_url) as store:
        rid = store.create_run("r", "milegpo", config=load_config("webshop").to_dict())
        store.record_checkpoint(rid, 18, "checkpoints/run_1/iter_000018", "0" * 64)  # not in tmp_path
        with RunLock(store, rid):
            with pytest.raises(RunLocked, match=rf"run {rid} is being trained by pid {os.getpid()} "):
                load_resume(store, rid, tmp_path)
        with pytest.raises(CheckpointError, match="records the checkpoint of iteration 18"):
            load_resume(store, rid, tmp_path)  # unlocked: the folder is checked


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_second_resume_of_a_run_in_training_is_refused(tmp_path, models_dir, backend, request):  # noqa: F811
    root = new_root(tmp_path, "runs", models_dir)
    db = ["--db", request.getfixturevalue("postgres_url")] if backend == "postgresql" else []
    store = RunStore(db[1] if db else f"sqlite:///{root / 'milegpo.db'}")
    res = milegpo([*train_args(root), *db, "--set", "run.iterations=1"], tmp_path)  # run 1, then made longer
    assert res.returncode == 0, res.stdout + res.stderr
    with store.engine.begin() as conn:
        config = store.get_run(1)["config"]
        config["run"]["iterations"] = 400
        conn.execute(update(Run).where(Run.id == 1).values(config=config))
    env = {**os.environ, "MILEGPO_FAULT": ""}
    first = subprocess.Popen([str(SCRIPT), "train", "--resume", "1", "--runs-dir", str(root), *db], cwd=tmp_path,
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while lock_row(store)[1] != first.pid or len(store.iterations(1)) < 2:
        assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
        time.sleep(0.5)
    res = milegpo(["train", "--resume", "1", "--runs-dir", str(root), *db], tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    [line] = res.stderr.strip().splitlines()
    assert line.startswith(f"error: run 1 is being trained by pid {first.pid} on host {socket.gethostname()}")
    assert first.poll() is None  # the first goes on
    before = [(r["id"], r["iteration"]) for r in store.iterations(1)]
    deadline = time.monotonic() + 120
    while len(store.iterations(1)) <= len(before) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    after = [(r["id"], r["iteration"]) for r in store.iterations(1)]
    assert len(after) > len(before) and after[:len(before)] == before  # it trains on; no row of it was rewritten
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=120) == 128 + signal.SIGTERM
    assert store.get_run(1)["status"] == "killed" and lock_row(store) == (None, None)
    store.close()


@pytest.mark.slow
def test_a_postgresql_store_lost_in_training_is_one_line(tmp_path, models_dir, postgres_url):  # noqa: F811
    from sqlalchemy import create_engine, make_url, text

    root = new_root(tmp_path, "runs", models_dir)
    store = RunStore(postgres_url)
    env = {**os.environ, "MILEGPO_FAULT": "", "COLUMNS": "160"}
    trainer = subprocess.Popen([str(SCRIPT), *train_args(root), "--db", postgres_url, "--set", "run.iterations=400"],
                               cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not store.iterations(1):
        assert trainer.poll() is None and time.monotonic() < deadline, trainer.stderr.read()
        time.sleep(0.2)
    store.close()
    name = make_url(postgres_url).database
    admin = create_engine(make_url(postgres_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:  # the database goes away under the trainer: no new connection, the open ones cut
        conn.execute(text(f"ALTER DATABASE {name} WITH ALLOW_CONNECTIONS false"))
        conn.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"))
    try:
        err = trainer.communicate(timeout=120)[1]
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"ALTER DATABASE {name} WITH ALLOW_CONNECTIONS true"))
        admin.dispose()
    assert trainer.returncode == 2, err
    [line] = err.strip().splitlines()  # no traceback, nor one of the lock's heartbeat thread
    assert line.startswith("error: cannot use store postgresql+psycopg://") and "it does not answer" in line, line
    assert "milegpo train --resume RUN" in line
    with RunStore(postgres_url) as store:  # what it committed is kept
        assert store.iterations(1) and store.get_run(1)["status"] == "running"


def test_lock_columns_are_added_to_an_older_store(store_url):
    from test_store import write_v1_store

    write_v1_store(store_url)  # schema 1 -> 2 -> 3 in place when opened
    with RunStore(store_url) as store:
        with RunLock(store, 1):
            assert lock_row(store) == (socket.gethostname(), os.getpid())
        assert store.get_run(1)["name"] == "old" and lock_row(store) == (None, None)
