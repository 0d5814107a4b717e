"""The run store on a real SQLite file and on a real PostgreSQL server (conftest.store_url): round
trips, idempotence, resume, schema version and in-place upgrade, concurrent writers."""
import math
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.orm import Session

from milegpo_cli.errors import RunNotFound, StoreError
from milegpo_cli.credit import Candidate
from milegpo_cli.store import EpisodeRecord, RunStore, StepRecord
from milegpo_cli.store.models import SCHEMA_VERSION


def episode(group="g0", index=0, success=True, steps=3, task="alfworld/train/pick/00001"):
    return EpisodeRecord(
        task_id=task, split="train", task_type="pick_and_place_simple", group=group, index=index,
        outcome=1.0 if success else 0.0, success=success, length=steps, invalid_count=1,
        steps=[StepRecord(t=t, state_key=f"s{t}", action=f"a{t}", reward=10.0 * (success and t == steps - 1),
                          advantage=0.5 - t, episode_advantage=0.5, step_advantage=-t, credit=0.25,
                          milestone=t == 1, trap=False, progress=1, branch=-1, unverified=t == 0,
                          oracle_good=None if t == 0 else t % 2 == 0, subgoals=("picked",) if t == 1 else ())
               for t in range(steps)])


def batch(n=4, steps=3):
    return [episode(index=i, success=i % 2 == 0, steps=steps) for i in range(n)]


def candidate(key="s1", distance=2.0, progress_ok=0.75, branch_ok=math.nan):
    return Candidate(group="g0", key=key, kind="milestone", n_pos=2, n_neg=1, rho=0.4, distance=distance,
                           progress_ok=progress_ok, branch_ok=branch_ok, credit=0.2)


@pytest.fixture
def store(store_url):
    with RunStore(store_url) as s:
        yield s


def test_sqlite_pragmas(tmp_path):
    with RunStore(tmp_path / "p.db") as store, store.engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA synchronous")).scalar() == 1  # NORMAL
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() >= 10_000


def test_run_round_trip(store):
    rid = store.create_run("r1", "milegpo", seed=3, recipe="alfworld", config={"ppo": {"lr": 1e-4}},
                           drop=["progress", "reliability"], git_commit="abc", versions={"alfworld": "0.4.2"})
    run = store.get_run(rid)
    assert (run["name"], run["algo"], run["seed"], run["status"]) == ("r1", "milegpo", 3, "created")
    assert run["config"] == {"ppo": {"lr": 1e-4}}
    assert run["drop"] == ["progress", "reliability"]
    assert run["versions"] == {"alfworld": "0.4.2"}
    store.set_status(rid, "running")
    store.set_mlflow_run_id(rid, "f00")
    assert store.get_run("r1")["status"] == "running"
    assert store.get_run(str(rid))["mlflow_run_id"] == "f00"
    assert run["git_commit"] == "abc"
    store.set_provenance(rid, "def", {"alfworld": "0.4.3", "torch": "2.13.0"})  # a registered run that starts
    assert store.get_run(rid)["git_commit"] == "def"  # training later records the code it trains under
    assert store.get_run(rid)["versions"] == {"alfworld": "0.4.3", "torch": "2.13.0"}
    with pytest.raises(StoreError, match="status: unknown 'weird'"):
        store.set_status(rid, "weird")


def test_experiments(store):
    eid = store.create_experiment("abl", kind="ablate", recipe="alfworld")
    a = store.create_run("a", "milegpo", experiment_id=eid)
    store.create_run("b", "gigpo")
    store.set_experiment_mlflow_run_id(eid, "parent")
    assert store.get_experiment("abl")["mlflow_run_id"] == "parent"
    assert [r["id"] for r in store.list_runs(experiment_id=eid)] == [a]
    assert len(store.list_experiments()) == 1


def test_missing_run_is_a_clear_error(store):
    with pytest.raises(RunNotFound, match=rf"run '42' not found in {re.escape(store.display_url)}"):
        store.get_run(42)
    with pytest.raises(RunNotFound, match="run 'ghost' not found"):
        store.get_run("ghost")
    with pytest.raises(RunNotFound, match="run 7 not found"):
        store.record_iteration(7, 1, {}, batch())


def test_record_iteration_round_trip(store):
    rid = store.create_run("r", "milegpo")
    store.record_iteration(rid, 1, {"loss": 0.5, "nan": float("nan")}, batch(4, 3),  # the estimators' candidates:
                           [candidate(), candidate("s9", math.inf, progress_ok=math.nan, branch_ok=1.0)])  # inf, NaN -> NULL
    [it] = store.iterations(rid)
    assert it["metrics"] == {"loss": 0.5, "nan": None}
    assert (it["episodes"], it["success_rate"], it["mean_outcome"], it["mean_length"]) == (4, 0.5, 0.5, 3.0)
    assert it["invalid_rate"] == pytest.approx(4 / 12)
    eps = store.episodes(rid, iteration=1)
    assert [e["index"] for e in eps] == [0, 1, 2, 3]
    assert [e["success"] for e in eps] == [True, False, True, False]
    steps = store.steps(rid, iteration=1)
    assert len(steps) == 12
    first = [s for s in steps if s["episode_id"] == eps[0]["id"]]
    assert [s["t"] for s in first] == [0, 1, 2]
    assert first[1]["subgoals"] == ["picked"] and first[1]["milestone"] is True
    assert first[0]["oracle_good"] is None and first[2]["oracle_good"] is True
    assert (first[2]["reward"], first[2]["advantage"], first[2]["branch"]) == (10.0, -1.5, -1)
    cands = store.candidates(rid, 1)
    assert [c["distance"] for c in cands] == [2.0, None]
    assert [(c["progress_ok"], c["branch_ok"]) for c in cands] == [(0.75, None), (None, 1.0)]
    assert store.list_runs()[0]["iterations"] == 1
    assert store.list_runs()[0]["last_success_rate"] == 0.5


def test_record_iteration_is_idempotent(store):
    rid = store.create_run("r", "milegpo")
    other = store.create_run("other", "grpo")
    store.record_iteration(other, 1, {}, batch(2))
    for _ in range(3):
        store.record_iteration(rid, 1, {"loss": 1.0}, batch(4), [candidate()])
    store.record_iteration(rid, 1, {"loss": 2.0}, batch(3), [candidate()])  # a rerun replaces it
    assert [i["metrics"]["loss"] for i in store.iterations(rid)] == [2.0]
    assert len(store.episodes(rid)) == 3
    assert len(store.steps(rid)) == 9
    assert len(store.candidates(rid)) == 1
    assert len(store.episodes(other)) == 2  # other runs untouched


def test_delete_after_for_resume(store):
    rid = store.create_run("r", "milegpo")
    for i in range(1, 5):
        store.record_iteration(rid, i, {"i": i}, batch(2), [candidate()])
        store.record_checkpoint(rid, i, f"runs/ckpt/{i}", "0" * 64)
        store.record_evaluation(rid, "id", {"success": 0.1 * i}, batch(2), iteration=i)
    store.delete_after(rid, 2)
    assert [i["iteration"] for i in store.iterations(rid)] == [1, 2]
    assert {e["iteration"] for e in store.episodes(rid)} == {1, 2}
    assert len(store.steps(rid)) == 2 * 2 * 3
    assert {c["iteration"] for c in store.candidates(rid)} == {1, 2}
    assert [e["iteration"] for e in store.evaluations(rid)] == [1, 2]
    assert store.latest_checkpoint(rid)["iteration"] == 2
    for ev in store.evaluations(rid):
        assert len(store.steps(rid, evaluation_id=ev["id"])) == 6


def test_evaluations(store):
    rid = store.create_run("r", "milegpo")
    store.record_iteration(rid, 5, {}, batch(2))
    e1 = store.record_evaluation(rid, "id", {"success": 0.5}, batch(4), iteration=5, phase="train")
    store.record_evaluation(rid, "id", {"success": 0.75}, batch(2), iteration=5, phase="train")  # replaces e1
    e3 = store.record_evaluation(rid, "ood", {"success": 0.25}, batch(4), iteration=5, checkpoint="ckpt/5")
    evs = store.evaluations(rid)
    assert [(e["split"], e["metrics"]["success"], e["episodes"]) for e in evs] == [("id", 0.75, 2), ("ood", 0.25, 4)]
    assert [e["phase"] for e in evs] == ["train", None]
    assert evs[1]["success_rate"] == 0.5 and evs[1]["checkpoint"] == "ckpt/5"
    assert len(store.episodes(rid, evaluation_id=e3)) == 4
    assert len(store.episodes(rid)) == 2  # training episodes only
    assert evs[0]["id"] != e1  # a replaced evaluation's id is not reused
    assert store.episodes(rid, evaluation_id=e1) == []
    assert sum(len(store.episodes(rid, evaluation_id=e["id"])) for e in evs) == 6


def test_evaluation_phases(store):
    rid = store.create_run("r", "milegpo")
    store.record_evaluation(rid, "id", {"success": 0.0}, batch(2), iteration=0, phase="untrained")
    store.record_evaluation(rid, "id", {"success": 0.5}, batch(2), iteration=0, phase="warmstart")  # kept beside it
    store.record_evaluation(rid, "id", {"success": 1.0}, batch(2), iteration=3, phase="train")
    assert [(e["iteration"], e["phase"], e["metrics"]["success"]) for e in store.evaluations(rid)] == [
        (0, "untrained", 0.0), (0, "warmstart", 0.5), (3, "train", 1.0)]
    with pytest.raises(StoreError, match="phase: unknown 'later'"):
        store.record_evaluation(rid, "id", {}, iteration=4, phase="later")


def test_checkpoints_replace(store):
    rid = store.create_run("r", "milegpo")
    store.record_checkpoint(rid, 3, "a", "1" * 64)
    store.record_checkpoint(rid, 3, "b", "2" * 64)
    assert [(c["path"], c["sha256"]) for c in store.checkpoints(rid)] == [("b", "2" * 64)]
    assert store.latest_checkpoint(store.create_run("empty", "grpo")) is None


def test_reopen_keeps_data_and_plain_path_is_sqlite(tmp_path):
    path = tmp_path / "x.db"
    with RunStore(path) as s:
        rid = s.create_run("r", "grpo")
    with RunStore(str(path)) as s:
        assert s.get_run(rid)["algo"] == "grpo"


def test_newer_schema_is_refused(store_url):
    url = store_url
    with RunStore(url) as s:
        with s.engine.begin() as conn:
            conn.execute(text("UPDATE schema_version SET version = :v"), {"v": SCHEMA_VERSION + 1})
    with pytest.raises(StoreError, match=rf"schema version {SCHEMA_VERSION + 1}, newer than this milegpo supports"):
        RunStore(url)


WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from test_store import batch, candidate
    from milegpo_cli.store import RunStore
    store = RunStore({url!r})
    rid = store.create_run(sys.argv[1], "milegpo")
    for i in range({iterations}):
        store.record_iteration(rid, i, {{"i": i}}, batch(4, 2), [candidate()])
        store.set_status(rid, "running")
    store.set_status(rid, "finished")
""")


def test_concurrent_writers_lose_nothing(store_url):
    url = store_url
    iterations = 40
    code = WRITER.format(tests=str(Path(__file__).parent), url=url, iterations=iterations)
    procs = [subprocess.Popen([sys.executable, "-c", code, f"w{k}"], stderr=subprocess.PIPE, text=True)
             for k in range(3)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    with RunStore(url) as s:
        runs = s.list_runs()
        assert sorted(r["name"] for r in runs) == ["w0", "w1", "w2"]
        for r in runs:
            assert r["status"] == "finished" and r["iterations"] == iterations
            assert len(s.episodes(r["id"])) == 4 * iterations
            assert len(s.steps(r["id"])) == 8 * iterations
            assert len(s.candidates(r["id"])) == iterations


def write_v1_store(url: str) -> None:
    """A store exactly as milegpo with schema version 1 wrote it (frozen models, tests/store_v1_models.py)."""
    import store_v1_models as v1

    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url)
    v1.Base.metadata.create_all(engine)
    with Session(engine) as s, s.begin():
        s.add(v1.SchemaVersion(version=1))
        run = v1.Run(name="old", algo="milegpo", config={"ppo": {"lr": 0.1}})
        s.add(run)
        s.flush()
        s.add(v1.Iteration(run_id=run.id, iteration=1, metrics={"loss": 1.0}, episodes=1))
        for it in (0, 1, None):
            ev = v1.Evaluation(run_id=run.id, iteration=it, split="id", metrics={"success": 0.5}, episodes=1)
            s.add(ev)
            s.flush()
            s.add(v1.Episode(run_id=run.id, iteration=it, evaluation_id=ev.id, task_id="t", split="id",
                             task_type="pick", group="g", index=0, outcome=1.0, success=True, length=1))
        for ok in (True, False, None):
            s.add(v1.Candidate(run_id=run.id, iteration=1, group="g0", key=f"s{ok}", kind="milestone", n_pos=1,
                               n_neg=0, rho=0.5, distance=1.0, progress_ok=ok, branch_ok=ok, credit=0.1))
    engine.dispose()


def test_v1_store_is_upgraded_in_place(store_url):
    write_v1_store(store_url)
    with RunStore(store_url) as s:
        [run] = s.list_runs()
        assert (run["name"], run["config"], run["iterations"]) == ("old", {"ppo": {"lr": 0.1}}, 1)
        evs = s.evaluations(run["id"])
        assert [(e["iteration"], e["phase"]) for e in evs] == [(0, "untrained"), (1, "train"), (None, None)]
        assert [len(s.episodes(run["id"], evaluation_id=e["id"])) for e in evs] == [1, 1, 1]
        cands = s.candidates(run["id"])
        assert [(c["key"], c["progress_ok"], c["branch_ok"]) for c in cands] == [
            ("sTrue", 1.0, 1.0), ("sFalse", 0.0, 0.0), ("sNone", None, None)]
        with s.engine.connect() as conn:
            cols = {c["name"]: c["type"] for c in inspect(conn).get_columns("candidates")}
            versions = conn.execute(text("SELECT version FROM schema_version ORDER BY version")).scalars().all()
        assert versions == [1, SCHEMA_VERSION]
        assert "progress_ok_v1" not in cols and cols["progress_ok"].python_type is float
        s.record_iteration(run["id"], 2, {}, batch(1), [candidate(progress_ok=0.5)])  # a v2 write
        assert [c["progress_ok"] for c in s.candidates(run["id"], 2)] == [0.5]
        # v3: episodes.final_state, unknown (NULL) for the old rows, written for new ones
        assert [e["final_state"] for e in s.episodes(run["id"], evaluation_id=evs[0]["id"])] == [None]
        ep = episode(index=0, success=False, steps=2)
        ep.final_state = "after the last step"
        s.record_iteration(run["id"], 3, {}, [ep])
        assert [e["final_state"] for e in s.episodes(run["id"], iteration=3)] == ["after the last step"]
    with RunStore(store_url) as s:  # opening it again changes nothing
        assert len(s.candidates(run["id"])) == 4
        assert s.evaluations(run["id"])[0]["phase"] == "untrained"


def test_upgrade_to_v5_makes_experiment_names_unique(store_url):
    """Experiments of one name (two commands started one experiment twice): the newest keeps the name,
    the others become NAME~ID, and a second experiment of a name can no longer be created."""
    from sqlalchemy.exc import IntegrityError

    write_v1_store(store_url)
    engine = create_engine(store_url)
    with engine.begin() as conn:
        for _ in range(3):
            conn.execute(text("INSERT INTO experiments (name, kind, recipe, config, created_at) "
                              "VALUES ('sweep-x', 'sweep', '', '{}', CURRENT_TIMESTAMP)"))
    engine.dispose()
    with RunStore(store_url) as s:
        names = [(e["id"], e["name"]) for e in s.list_experiments()]
        newest = max(i for i, n in names if n == "sweep-x")
        assert sorted(n for _, n in names if n.startswith("sweep-x")) == sorted(
            ["sweep-x"] + [f"sweep-x~{i}" for i, _ in names if i != newest and _.startswith("sweep-x")])
        assert s.get_experiment("sweep-x")["id"] == newest
        with pytest.raises(IntegrityError):
            s.create_experiment("sweep-x")
        assert s.create_experiment_once("sweep-x") == newest
