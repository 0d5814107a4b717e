"""Several training processes on one store (SQLite, and a real PostgreSQL: conftest.store_url) and
one MLflow store at once: every run finishes, no "database is locked", no row lost or duplicated;
`milegpo ablate --parallel 2` too (issue 8, docs/reliability.md)."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from milegpo_cli.store import RunStore
from conftest import TINY_MODEL

SCRIPT = Path(sys.executable).with_name("milegpo")
TINY = [*TINY_MODEL,
        "rollout.groups=2", "rollout.group_size=2", "ppo.epochs=1",
        "eval.episodes=2", "eval.splits=['id']", "run.threads=1", "env.max_steps=4",
        "env.webshop.num_products=300", "env.webshop.train_instructions=80", "env.webshop.eval_instructions=8",
        "checkpoint.every=1", "eval.every=2", "rollout.train_tasks=16", "base.enabled=false", "eval.probe_states=6"]
EPISODES = 4  # groups x group_size


def sets(*extra: str) -> list[str]:
    return [a for kv in (*TINY, *extra) for a in ("--set", kv)]


def spawn(args: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "COLUMNS": "160", "MILEGPO_FAULT": ""}
    return subprocess.Popen([str(SCRIPT), *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory) -> Path:
    """The tiny model, built once (concurrent first builds of it race: see docs/reliability.md)."""
    from milegpo_cli.config import load_config
    from milegpo_cli.policy.tiny import ensure_tiny_model
    from milegpo_cli.policy.prompts import template_corpus
    from milegpo_cli.trainer.builders import build_suite

    models = tmp_path_factory.mktemp("models")
    config = load_config("webshop", TINY)
    suite = build_suite(config)
    ensure_tiny_model(config.policy.tiny, [*suite.text_corpus(), *template_corpus()], models)
    return models


def runs_dir(tmp_path: Path, models: Path) -> Path:
    root = tmp_path / "runs"
    root.mkdir()
    (root / "models").symlink_to(models, target_is_directory=True)
    return root


def assert_run_complete(url: str | Path, run_id: int, iterations: int) -> None:
    """Every iteration exactly once, each with all its episodes and their steps; evaluations once."""
    engine = create_engine(url if "://" in str(url) else f"sqlite:///{url}")
    try:
        with engine.connect() as conn:
            def q(sql: str) -> list:
                return conn.execute(text(sql), {"run": run_id}).all()

            its = [r[0] for r in q("SELECT iteration FROM iterations WHERE run_id=:run ORDER BY iteration")]
            assert its == list(range(1, iterations + 1))
            eps = q("SELECT iteration, \"group\", \"index\", length, id FROM episodes "
                    "WHERE run_id=:run AND evaluation_id IS NULL")
            assert len(eps) == EPISODES * iterations
            assert len({(i, g, k) for i, g, k, _, _ in eps}) == len(eps)  # no duplicate episode
            steps = q("SELECT s.episode_id, s.t FROM steps s JOIN episodes e ON e.id = s.episode_id "
                      "WHERE e.run_id=:run AND e.evaluation_id IS NULL ORDER BY s.episode_id, s.t")
            for *_, length, eid in eps:
                assert [t for e, t in steps if e == eid] == list(range(length))
            evals = [tuple(r) for r in q("SELECT iteration, split FROM evaluations WHERE run_id=:run")]
            assert sorted(evals) == sorted({(0, "id"), *((i, "id") for i in range(2, iterations + 1, 2)),
                                            (iterations, "id")})
            assert q("SELECT status FROM runs WHERE id=:run")[0][0] == "finished"
    finally:
        engine.dispose()


@pytest.mark.slow
def test_three_trainers_share_one_store(tmp_path, models_dir, store_url):
    root = runs_dir(tmp_path, models_dir)
    iterations = 3
    procs = [spawn(["train", "-r", "webshop", *sets(f"run.iterations={iterations}"), "--seed", str(seed),
                    "--runs-dir", str(root), "--db", store_url], tmp_path) for seed in range(3)]
    outs = [p.communicate(timeout=400)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert not any("locked" in o.lower() for o in outs), outs
    with RunStore(store_url) as store:
        runs = [(r["id"], r["seed"]) for r in store.list_runs()]
    assert sorted(seed for _, seed in runs) == [0, 1, 2]
    for run_id, _ in runs:
        assert_run_complete(store_url, run_id, iterations)
    mlflow = sqlite3.connect(root / "mlflow.db")  # the shared MLflow store got all three runs
    assert mlflow.execute("SELECT count(*) FROM runs WHERE status='FINISHED'").fetchone()[0] == 3
    mlflow.close()


@pytest.mark.slow
def test_ablate_parallel_members_share_one_store(tmp_path, models_dir):
    root = runs_dir(tmp_path, models_dir)
    proc = spawn(["ablate", "-r", "webshop", *sets(), "--drop", "traps", "--seeds", "1", "--iterations", "1",
                  "--parallel", "2", "--runs-dir", str(root)], tmp_path)
    out = proc.communicate(timeout=400)[0]
    assert proc.returncode == 0, out
    logs = "".join(p.read_text() for p in (root / "logs").glob("*.log"))
    assert "locked" not in (out + logs).lower(), out + logs
    con = sqlite3.connect(root / "milegpo.db")
    runs = con.execute("SELECT id, \"drop\" FROM runs WHERE experiment_id IS NOT NULL").fetchall()
    con.close()
    assert sorted(d for _, d in runs) == ['["traps"]', "[]"]
    for run_id, _ in runs:
        assert_run_complete(root / "milegpo.db", run_id, 1)


def _runs_with_iterations(db: Path) -> int:
    """How many runs of the store ``db`` have finished an iteration; 0 before the parent has made its tables."""
    if not db.exists():
        return 0
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT count(DISTINCT run_id) FROM iterations").fetchone()[0]
    except sqlite3.OperationalError:  # no such table yet, or a writer holds the lock: look again next second
        return 0
    finally:
        con.close()


def _member_processes(db: Path) -> list[int]:
    """Pids of live `milegpo train --resume` processes on the store ``db`` (Linux /proc)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"--resume" in cmd and any(str(db).encode() in a for a in cmd):
            pids.append(int(proc.name))
    return pids


@pytest.mark.slow
def test_sigterm_stops_ablate_members_and_marks_them_killed(tmp_path, models_dir):
    import signal
    import time

    root = runs_dir(tmp_path, models_dir)
    db = root / "milegpo.db"
    proc = spawn(["ablate", "-r", "webshop", *sets(), "--drop", "traps", "--seeds", "1", "--iterations", "500",
                  "--parallel", "2", "--runs-dir", str(root)], tmp_path)
    deadline = time.monotonic() + 300
    trained = 0
    while trained < 2 and time.monotonic() < deadline and proc.poll() is None:  # both members in their loop
        time.sleep(1.0)
        trained = _runs_with_iterations(db)
    assert trained == 2 and len(_member_processes(db)) == 2, proc.communicate(timeout=60)[0]
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=180)[0]
    assert proc.returncode != 0, out
    assert _member_processes(db) == [], out  # no orphaned member keeps training
    con = sqlite3.connect(db)
    statuses = [s for (s,) in con.execute("SELECT status FROM runs WHERE experiment_id IS NOT NULL")]
    con.close()
    assert statuses == ["killed", "killed"], out
    mlflow = sqlite3.connect(root / "mlflow.db")  # the ablate parent run and both members
    assert [s for (s,) in mlflow.execute("SELECT status FROM runs")] == ["KILLED"] * 3
    mlflow.close()
