"""Environment and numerical faults, and where commands may write (issue 8, docs/reliability.md).

Faults are injected with the MILEGPO_FAULT hook (envs/faults.py) at the named point ``env.step``
inside the real WebShop simulator and the real ALFWorld engine (in its worker processes)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from envs import faults
from milegpo_cli.cli import app
from milegpo_cli.config import load_config
from milegpo_cli.store import RunStore
from milegpo_cli.trainer import loop
from conftest import TINY_MODEL

torch.set_num_threads(1)
SCRIPT = Path(sys.executable).with_name("milegpo")
REPO = Path(__file__).resolve().parents[1]
TINY = [*TINY_MODEL,
        "rollout.groups=2", "rollout.group_size=2", "ppo.epochs=1",
        "eval.episodes=2", "eval.splits=['id']", "run.threads=1", "env.max_steps=4",
        "env.webshop.num_products=300", "env.webshop.train_instructions=80", "env.webshop.eval_instructions=8",
        "base.enabled=false", "rollout.train_tasks=8", "eval.probe_states=0"]  # no probe: fault step counts stay fixed


@pytest.fixture
def fault(monkeypatch):
    """Set MILEGPO_FAULT for this process (hit counters start from zero)."""
    def set_rules(spec: str) -> None:
        faults._hits.clear()
        monkeypatch.setenv(faults.ENV_VAR, spec)
    yield set_rules
    faults._hits.clear()


def quiet() -> Console:
    return Console(file=open(os.devnull, "w"), width=120)


def test_fault_rules_parse_and_fire(fault):
    assert faults.parse_rules("a:2, b:1+:flag,c:3:raise") == (("a", 2, False, "kill"), ("b", 1, True, "flag"),
                                                             ("c", 3, False, "raise"))
    for bad in ("a", "a:x", "a:1:explode", ":1"):
        with pytest.raises(ValueError, match="MILEGPO_FAULT"):
            faults.parse_rules(bad)
    fault("p:2:raise,q:2+:flag")
    assert not faults.fault_point("p")
    with pytest.raises(faults.InjectedFault, match="injected fault at p"):
        faults.fault_point("p")
    assert not faults.fault_point("p")
    assert [faults.fault_point("q") for _ in range(4)] == [False, True, True, True]


# --- WebShop simulator ------------------------------------------------------------------------

def webshop_venv(timeout: float = 0.5):
    from envs.registry import make_suite

    config = load_config("webshop", [*TINY, f"env.webshop.step_timeout_s={timeout}"])
    suite = make_suite("webshop", webshop=config.env.webshop, max_steps=config.env.max_steps)
    return suite, suite.make_vector_env(3, oracle=True)


def test_webshop_step_exception_and_hang_end_only_their_episode(fault):
    suite, venv = webshop_venv(timeout=0.5)
    tasks = suite.tasks("train", 3)
    obs = venv.reset(tasks)
    fault("env.step:1:raise,env.step:3:hang")  # first step of episode 0 raises, of episode 2 hangs
    start = time.perf_counter()
    res = venv.step([o.admissible[0] for o in obs])
    assert time.perf_counter() - start < 5  # the hang was cut at step_timeout_s
    assert res[0].done and "Traceback" in res[0].error and "InjectedFault: injected fault at env.step" in res[0].error
    assert res[2].done and "StepTimeout: step took longer than step_timeout_s = 0.5 s" in res[2].error
    assert res[1].error is None and not res[1].done
    assert res[0].observation == obs[0]  # the last good observation is kept
    again = venv.step([None, res[1].observation.admissible[0], None])  # episode 1 goes on
    assert again[0] is None and again[2] is None and again[1].error is None
    fresh = venv.reset(tasks)  # the errored environments start over
    assert [o.state_key for o in fresh] == [o.state_key for o in obs]
    assert all(r.error is None for r in venv.step([o.admissible[0] for o in fresh]))


@pytest.mark.slow
def test_training_goes_on_when_webshop_episodes_fail(tmp_path, fault):
    """A raising and a hanging step during training: both episodes are stored errored with their
    tracebacks, left out of the update, and every iteration finishes."""
    config = load_config("webshop", [*TINY, "run.iterations=2", "eval.every=5", "checkpoint.every=5",
                                     "env.webshop.step_timeout_s=0.5", f"store.root={json.dumps(str(tmp_path))}"])
    store = RunStore(config.store.db)
    fault("env.step:12:raise,env.step:15:hang")  # the evaluation at iteration 0 takes <= 8 steps
    run_id = loop.train(config, store, config.store.mlflow_uri, console=quiet())
    assert store.get_run(run_id)["status"] == "finished"
    its = store.iterations(run_id)
    assert [r["iteration"] for r in its] == [1, 2]
    episodes = store.episodes(run_id)
    errored = [e for e in episodes if e["error"]]
    assert len(episodes) == 8 and len(errored) == 2
    assert any("InjectedFault" in e["error"] for e in errored)
    assert any("StepTimeout" in e["error"] for e in errored)
    assert sum(r["metrics"]["errored"] for r in its) == 2
    for e in errored:  # their steps are stored up to the fault
        assert len(store.steps(run_id, iteration=e["iteration"])) >= e["length"] >= 1


# --- ALFWorld engine --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def alfworld_tasks(tmp_path_factory):
    pytest.importorskip("alfworld")
    os.environ.setdefault("ALFWORLD_DATA", str(REPO / "runs" / "alfworld_data"))
    from envs.alfworld import AlfworldConfig
    from envs.registry import make_suite

    config = AlfworldConfig(data_dir=str(tmp_path_factory.mktemp("alfw")), min_receptacles=4, max_receptacles=5,
                            max_objects=4, task_types=("pick_and_place_simple",))
    return make_suite("alfworld", alfworld=config).tasks("train", 2)


@pytest.mark.slow
def test_alfworld_engine_exception_and_hang_in_workers(alfworld_tasks, fault):
    from envs.alfworld.engine import AlfworldVectorEnv

    task = alfworld_tasks[0]
    # 3 slots on 2 workers in blocks: worker 0 steps slots 0 and 1, worker 1 slot 2. The rule is read
    # by the workers spawned now; their replacements start without it (a transient fault).
    fault("env.step:2:raise")
    venv = AlfworldVectorEnv(3, workers=2, step_timeout_s=2.0)
    os.environ.pop(faults.ENV_VAR)
    try:
        obs = venv.reset([task] * 3)
        res = venv.step([o.admissible[0] for o in obs])  # 2nd step in worker 0 = slot 1
        assert "InjectedFault: injected fault at env.step" in res[1].error and "Traceback" in res[1].error
        assert res[0].error is None and res[2].error is None
        again = venv.step([res[0].observation.admissible[0], None, None])  # slot 0 goes on, slot 1 is over
        assert again[0].error is None and again[1] is None
    finally:
        venv.close()

    fault("env.step:2:hang")
    venv = AlfworldVectorEnv(3, workers=2, step_timeout_s=2.0)
    os.environ.pop(faults.ENV_VAR)
    try:
        obs = venv.reset([task] * 3)
        start = time.perf_counter()
        res = venv.step([o.admissible[0] for o in obs])
        assert time.perf_counter() - start < 20
        assert all("EngineTimeout" in res[i].error for i in (0, 1))  # worker 0 hung: its slots end
        assert res[2].error is None and not res[2].done  # worker 1's episode goes on
        obs = venv.reset([task] * 3)  # worker 0 was replaced (worker 1 still holds the rule: not stepped)
        again = venv.step([obs[0].admissible[0], obs[1].admissible[0], None])
        assert again[0].error is None and again[1].error is None
    finally:
        venv.close()


# --- numerical faults -------------------------------------------------------------------------

@pytest.mark.slow
def test_non_finite_updates_are_skipped_then_training_stops(tmp_path, fault):
    extra = ["eval.every=5", "checkpoint.every=5", "ppo.max_bad_updates=2"]
    config = load_config("webshop", [*TINY, *extra, "run.iterations=3", f"store.root={json.dumps(str(tmp_path / 'a'))}"])
    store = RunStore(config.store.db)
    console = Console(file=open(os.devnull, "w"), width=200, record=True)
    fault("ppo.advantages:2:flag")  # the advantages of iteration 2 are NaN: its update is skipped
    run_id = loop.train(config, store, config.store.mlflow_uri, console=console)
    its = store.iterations(run_id)
    assert [r["iteration"] for r in its] == [1, 2, 3] and store.get_run(run_id)["status"] == "finished"
    bad = its[1]["metrics"]
    assert bad["skipped"] and bad["optimizer_steps"] == 0 and bad["skipped_reason"] == "non-finite advantages"
    assert its[0]["metrics"]["optimizer_steps"] >= 1 and its[2]["metrics"]["optimizer_steps"] >= 1
    assert "iteration 2: update skipped (non-finite advantages)" in console.export_text()

    fault("ppo.loss:1+:flag")  # every loss NaN: stop after ppo.max_bad_updates = 2 in a row
    result = CliRunner().invoke(app, ["train", "-r", "webshop", *[a for kv in (*TINY, *extra, "run.iterations=5")
                                                                  for a in ("--set", kv)],
                                      "--runs-dir", str(tmp_path / "b")])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        "error: training stopped: 2 consecutive updates skipped for non-finite loss or advantages "
        "(last at iteration 2)"]
    with RunStore(tmp_path / "b" / "milegpo.db") as b:
        assert b.get_run(1)["status"] == "failed"
        assert [r["iteration"] for r in b.iterations(1)] == [1, 2]
        assert all(r["metrics"]["skipped_reason"] == "non-finite loss or gradient" for r in b.iterations(1))


# --- where commands bind and write ------------------------------------------------------------

@pytest.mark.parametrize("args, host", [([], "127.0.0.1"), (["--host", "0.0.0.0"], "0.0.0.0")])
def test_ui_binds_to_localhost_unless_told(tmp_path, monkeypatch, args, host):
    seen = []

    def fake_exec(path, argv):  # what `milegpo ui` would exec
        seen.append(argv)
        raise SystemExit(0)

    monkeypatch.setattr(os, "execv", fake_exec)
    result = CliRunner().invoke(app, ["ui", "--runs-dir", str(tmp_path), "--port", "5999", *args])
    assert result.exit_code == 0, result.output
    (argv,) = seen
    assert argv[1:4] == ["-m", "mlflow", "ui"]
    assert argv[argv.index("--host") + 1] == host and argv[argv.index("--port") + 1] == "5999"
    assert argv[argv.index("--backend-store-uri") + 1] == f"sqlite:///{tmp_path / 'mlflow.db'}"


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


@pytest.mark.slow
def test_train_writes_only_inside_its_run_directory(tmp_path):
    cwd, home, tmp, runs = (tmp_path / d for d in ("cwd", "home", "tmp", "rd"))
    for d in (cwd, home, tmp):
        d.mkdir()
    repo_runs = {p.name for p in (REPO / "runs").iterdir()} if (REPO / "runs").exists() else set()
    repo_top = {p.name for p in REPO.iterdir()}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MILEGPO_", "MLFLOW_", "HF_", "XDG_"))}
    env.update(HOME=str(home), TMPDIR=str(tmp), COLUMNS="120")
    sets = [a for kv in (*TINY, "run.iterations=2", "eval.every=1", "checkpoint.every=1") for a in ("--set", kv)]
    res = subprocess.run([str(SCRIPT), "train", "-r", "webshop", *sets, "--runs-dir", str(runs)], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert tree(cwd) == set() and tree(tmp) == set()
    assert tree(home) == set(), tree(home)
    assert {p.name for p in REPO.iterdir()} == repo_top  # nothing new in the repository...
    assert {p.name for p in (REPO / "runs").iterdir()} <= repo_runs  # ...nor in its default run directory
    assert {"milegpo.db", "mlflow.db", "checkpoints", "models"} <= {p.name for p in runs.iterdir()}


def test_default_alfworld_cache_follows_the_run_directory(tmp_path):
    root = tmp_path / "rd"
    config = load_config("alfworld", [], {"store.root": str(root)})
    assert config.env.alfworld.data_dir == str(root / "alfworld")
    assert load_config("alfworld").env.alfworld.data_dir == "runs/alfworld"  # the default run directory
    shared = load_config("alfworld", ['env.alfworld.data_dir="/shared/games"'], {"store.root": str(root)})
    assert shared.env.alfworld.data_dir == "/shared/games"  # a cache named by the recipe is kept
