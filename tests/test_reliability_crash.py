"""Kill -9 a tiny training run at exact points (MILEGPO_FAULT, envs/faults.py) and at random times,
then `milegpo train --resume RUN` until it finishes: every iteration is stored exactly once, no
half-written checkpoint is ever loaded, and the result equals an uninterrupted run with the same
seed (issue 8, docs/reliability.md)."""
from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY_MODEL

SCRIPT = Path(sys.executable).with_name("milegpo")
ITERATIONS = 6
TINY = [*TINY_MODEL,
        "rollout.groups=2", "rollout.group_size=2", "ppo.epochs=1",
        "eval.episodes=2", "eval.splits=['id']", "eval.probe_states=6", "run.threads=1", "env.max_steps=4",
        "base.enabled=false", "warmstart.enabled=false", "rollout.train_tasks=8",
        "env.webshop.num_products=300", "env.webshop.train_instructions=80", "env.webshop.eval_instructions=8",
        f"run.iterations={ITERATIONS}", "checkpoint.every=2", "checkpoint.keep=2", "eval.every=3", "run.seed=3"]
TIMING = ("time", "per_s", "host_")
KILL_TRIALS = int(os.environ.get("MILEGPO_KILL_TRIALS", "1"))


def milegpo(args: list[str], cwd: Path, fault: str = "", timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "160", "MILEGPO_FAULT": fault}
    return subprocess.run([str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def train_args(root: Path) -> list[str]:
    return ["train", "-r", "webshop", *[a for kv in TINY for a in ("--set", kv)], "--runs-dir", str(root)]


def resume_args(root: Path) -> list[str]:
    return ["train", "--resume", "1", "--runs-dir", str(root)]


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory) -> Path:
    from milegpo_cli.config import load_config
    from milegpo_cli.policy.prompts import template_corpus
    from milegpo_cli.policy.tiny import ensure_tiny_model
    from milegpo_cli.trainer.builders import build_suite

    models = tmp_path_factory.mktemp("models")
    config = load_config("webshop", TINY)
    ensure_tiny_model(config.policy.tiny, [*build_suite(config).text_corpus(), *template_corpus()], models)
    return models


def new_root(base: Path, name: str, models: Path) -> Path:
    root = base / name
    root.mkdir(parents=True)
    (root / "models").symlink_to(models, target_is_directory=True)
    return root


def snapshot(root: Path) -> dict:
    """What the store holds for run 1, without wall-clock figures."""
    import json

    con = sqlite3.connect(root / "milegpo.db")
    try:
        if not con.execute("SELECT 1 FROM sqlite_master WHERE name = 'runs'").fetchone():  # killed before its schema
            return {"iterations": [], "episodes": [], "steps": [], "evaluations": [], "status": None}
        its = [(i, {k: v for k, v in json.loads(m).items() if not any(t in k for t in TIMING)}, n)
               for i, m, n in con.execute("SELECT iteration, metrics, episodes FROM iterations WHERE run_id=1 "
                                          "ORDER BY iteration")]
        eps = con.execute("SELECT iteration, \"group\", \"index\", task_id, length, outcome, error FROM episodes "
                          "WHERE run_id=1 AND evaluation_id IS NULL ORDER BY iteration, \"group\", \"index\"").fetchall()
        steps = con.execute("SELECT e.iteration, e.\"group\", e.\"index\", s.t, s.state_key, s.action, s.reward, "
                            "s.advantage FROM steps s JOIN episodes e ON s.episode_id = e.id "
                            "WHERE e.run_id=1 AND e.evaluation_id IS NULL "
                            "ORDER BY e.iteration, e.\"group\", e.\"index\", s.t").fetchall()
        evals = con.execute("SELECT iteration, split, episodes, success_rate, mean_outcome FROM evaluations "
                            "WHERE run_id=1 ORDER BY iteration, split").fetchall()
        status = con.execute("SELECT status FROM runs WHERE id=1").fetchone()
    finally:
        con.close()
    return {"iterations": its, "episodes": eps, "steps": steps, "evaluations": evals,
            "status": status[0] if status else None}


def without_wall(snap: dict) -> dict:
    return {k: v for k, v in snap.items() if k != "wall_s"}


def assert_consistent(root: Path) -> None:
    """After any crash: the stored iterations are 1..k, each once with all its episodes and steps."""
    if not (root / "milegpo.db").exists():
        return
    snap = snapshot(root)
    its = [i for i, _, _ in snap["iterations"]]
    assert its == list(range(1, len(its) + 1)), its
    keys = [(i, g, k) for i, g, k, *_ in snap["episodes"]]
    assert len(keys) == len(set(keys)) == 4 * len(its)
    lengths = {(i, g, k): n for i, g, k, _, n, *_ in snap["episodes"]}
    counted: dict = {}
    for i, g, k, t, *_ in snap["steps"]:
        counted[(i, g, k)] = counted.get((i, g, k), 0) + 1
    assert counted == {key: n for key, n in lengths.items() if n}
    evals = [(i, s) for i, s, *_ in snap["evaluations"]]
    assert len(evals) == len(set(evals))


def assert_checkpoints_whole(root: Path) -> None:
    """Every listed checkpoint verifies against its manifest (a killed write leaves only .tmp-*)."""
    from milegpo_cli.trainer.checkpoint import list_checkpoints, verify_checkpoint

    for _, path in list_checkpoints(root / "checkpoints" / "run_1"):
        verify_checkpoint(path)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, models_dir) -> dict:
    root = new_root(tmp_path_factory.mktemp("reference"), "runs", models_dir)
    start = time.perf_counter()
    res = milegpo(train_args(root), root.parent)
    assert res.returncode == 0, res.stdout + res.stderr
    snap = snapshot(root)
    assert snap["status"] == "finished" and len(snap["iterations"]) == ITERATIONS
    return {**snap, "wall_s": time.perf_counter() - start}


# (fault rule, what is interrupted, iterations stored after the kill). Checkpoints at 2, 4, 6.
# Commits of a process resumed from checkpoint 2: 1 schema check, 2 delete_after, 3 status,
# 4 iteration 3, 5 its evaluation, 6 iteration 4.
KILL_POINTS = [
    ("env.step:40", "an environment step during a rollout (iteration 2 or later, no checkpoint yet)", None),
    ("checkpoint.write:2", "the checkpoint of iteration 4, trainer state on disk, manifest not yet", 4),
    ("ppo.step:2", "the update of iteration 4 (resumed from checkpoint 2), before the optimizer step", 3),
    ("store.commit:6", "the transaction of iteration 4's rows, written, not yet committed", 3),
]


@pytest.mark.slow
def test_kill_at_each_point_then_resume_equals_uninterrupted(tmp_path, models_dir, reference):
    from milegpo_cli.trainer.checkpoint import list_checkpoints

    root = new_root(tmp_path, "runs", models_dir)
    ckpts = root / "checkpoints" / "run_1"
    for k, (rule, where, stored) in enumerate(KILL_POINTS):
        res = milegpo(resume_args(root) if k else train_args(root), tmp_path, fault=rule)
        assert res.returncode == -signal.SIGKILL, f"{rule} ({where}) did not fire: {res.stdout}{res.stderr}"
        assert_consistent(root)
        assert_checkpoints_whole(root)
        if rule.startswith("checkpoint.write"):
            assert list(ckpts.glob(".tmp-*")), "the killed write left no temp folder"
        if stored is not None:
            assert len(snapshot(root)["iterations"]) == stored, rule
        if k:
            assert [i for i, _ in list_checkpoints(ckpts)] == [2], rule
        print(f"killed at {rule}: stored iterations {len(snapshot(root)['iterations'])}, "
              f"checkpoints {[i for i, _ in list_checkpoints(ckpts)]}")
    res = milegpo(resume_args(root), tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert snapshot(root) == without_wall(reference)


@pytest.mark.slow
def test_kill_at_random_times_then_resume_equals_uninterrupted(tmp_path, models_dir, reference):
    """KILL_TRIALS runs, each SIGKILLed after a random delay (seed printed), resumed to the end."""
    seed = int(os.environ.get("MILEGPO_KILL_SEED", time.time_ns() % 10**6))
    rng = random.Random(seed)
    killed = 0
    for trial in range(KILL_TRIALS):
        root = new_root(tmp_path, f"t{trial}", models_dir)
        proc = subprocess.Popen([str(SCRIPT), *train_args(root)], cwd=tmp_path, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env={**os.environ, "MILEGPO_FAULT": ""})
        delay = rng.uniform(2.0, reference["wall_s"])  # from start-up to the last iteration
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            killed += 1
        assert_consistent(root)
        assert_checkpoints_whole(root)
        if not (root / "milegpo.db").exists() or snapshot(root)["status"] is None:
            res = milegpo(train_args(root), tmp_path)  # killed before the run was created: start again
        else:
            res = milegpo(resume_args(root), tmp_path)
        assert res.returncode == 0, f"seed {seed} trial {trial} delay {delay:.1f}s: {res.stdout}{res.stderr}"
        assert snapshot(root) == without_wall(reference), f"seed {seed} trial {trial} delay {delay:.1f}s"
    print(f"random kills: seed {seed}, {killed}/{KILL_TRIALS} runs killed mid-way, all resumed to the reference")
