"""Reliability II (issue 35): where commands write, which stores they open, and the inputs users
bring. Every refusal is one line on stderr and exit code 2, and nothing is created or replaced by
a command that refuses. Real files, devices, FIFOs, SQLite files and the embedded PostgreSQL."""
from __future__ import annotations

import contextlib
import gzip
import json
import os
import socket
import sqlite3
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from milegpo_cli.cli import app
from milegpo_cli.errors import StoreError
from milegpo_cli.store import EpisodeRecord, RunStore
from test_reliability_inputs import one_error_line

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]
ROLLOUTS = [{"group": f"g{g}", "rollout": i, "outcome": float(i % 2),
             "steps": [{"state": f"s{t}", "action": f"a{(t + i) % 2}", "reward": float(i % 2) * (t == 2)}
                       for t in range(3)]} for g in range(2) for i in range(4)]


def listing(folder: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every entry under ``folder`` with its mode and (regular files) its bytes."""
    out = {}
    for p in sorted(folder.rglob("*")):
        st = os.lstat(p)
        out[str(p.relative_to(folder))] = (st.st_mode, p.read_bytes() if stat.S_ISREG(st.st_mode) else None)
    return out


def rollouts_file(path: Path, rows=ROLLOUTS) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def credit(*args: str):
    return runner.invoke(app, ["credit", *map(str, args)])


@contextlib.contextmanager
def unwritable(*paths: Path):
    """Make files and folders unwritable even for root: the immutable attribute (chattr +i) as
    root, file modes otherwise. Skipped where neither holds (e.g. root on a file system without
    attributes)."""
    if os.geteuid() == 0:
        done = []
        try:
            for p in paths:
                if subprocess.run(["chattr", "+i", str(p)], capture_output=True).returncode != 0:
                    pytest.skip(f"chattr +i is not available on {p} (root ignores file modes)")
                done.append(p)
            yield
        finally:
            for p in done:
                subprocess.run(["chattr", "-i", str(p)], check=True)
    else:
        modes = {p: stat.S_IMODE(p.stat().st_mode) for p in paths}
        try:
            for p in paths:
                p.chmod(modes[p] & ~0o222)
            yield
        finally:
            for p, mode in modes.items():
                p.chmod(mode)
    for p in paths:
        assert os.access(p, os.W_OK)


def store_with_runs(db: Path) -> None:
    """Two finished runs of one experiment, each with an iteration and id / ood evaluations."""
    with RunStore(db) as store:
        exp = store.create_experiment("e")
        for algo, wins in (("gigpo", 1), ("milegpo", 2)):
            rid = store.create_run(f"{algo}-s0", algo, seed=0, experiment_id=exp,
                                   config={"env": {"name": "alfworld"}, "store": {"root": str(db.parent)}})
            store.record_iteration(rid, 1, {"steps": 10.0}, [EpisodeRecord("t", "train", "pick", "g0", i, 1.0, True, 4)
                                                             for i in range(2)])
            for split in ("id", "ood"):
                store.record_evaluation(rid, split, {}, [EpisodeRecord(f"{split}{i}", split, "pick", "e", 0,
                                                                       float(i < wins), i < wins, 5)
                                                         for i in range(4)], iteration=1)
            store.set_status(rid, "finished")


# --- outputs of `milegpo credit` (item 2) -------------------------------------------------------

def test_credit_output_onto_a_symlink_writes_its_target(tmp_path):
    src = rollouts_file(tmp_path / "r.jsonl")
    assert credit(src, "-o", tmp_path / "plain.jsonl").exit_code == 0
    (tmp_path / "out").mkdir()
    link, dangling = tmp_path / "link.jsonl", tmp_path / "dangling.jsonl"
    (tmp_path / "out" / "target.jsonl").write_text("old\n")
    link.symlink_to("out/target.jsonl")
    dangling.symlink_to("out/new.jsonl")
    for path, target in ((link, "target.jsonl"), (dangling, "new.jsonl")):
        result = credit(src, "-o", path, "--milestones", tmp_path / "ms.json")
        assert result.exit_code == 0, result.output
        assert path.is_symlink()  # the link stays, its target holds the output
        assert (tmp_path / "out" / target).read_text() == (tmp_path / "plain.jsonl").read_text()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["new.jsonl", "target.jsonl"]  # no temp file


def make_char_device(path: Path, minor: int) -> None:
    """A private copy of /dev/null (minor 3) or /dev/full (minor 7): the machine's own are never used."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
    except PermissionError:
        pytest.skip("mknod needs root (CAP_MKNOD)")


def test_credit_output_onto_devices_and_fifos_writes_through(tmp_path):
    src = rollouts_file(tmp_path / "r.jsonl")
    null, full, fifo = tmp_path / "null", tmp_path / "full", tmp_path / "fifo"
    make_char_device(null, 3)
    make_char_device(full, 7)
    os.mkfifo(fifo)
    assert credit(src, "-o", null, "--milestones", null).exit_code == 0  # a device may take both outputs
    line = one_error_line(credit(src, "-o", full))
    assert line == f"error: -o {full}: cannot be written (No space left on device)"
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
    reader.start()
    result = credit(src, "-o", fifo)
    reader.join(timeout=60)
    assert result.exit_code == 0, result.output
    assert [json.loads(x)["t"] for x in received[0].splitlines()] == [0, 1, 2] * 8
    assert stat.S_ISCHR(os.lstat(null).st_mode) and stat.S_ISCHR(os.lstat(full).st_mode)  # still devices
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "full", "null", "r.jsonl"]


def test_credit_output_equal_to_an_input_is_refused(tmp_path):
    src = rollouts_file(tmp_path / "r.jsonl")
    (tmp_path / "hard.jsonl").hardlink_to(src)
    (tmp_path / "link.jsonl").symlink_to("r.jsonl")
    before = listing(tmp_path)
    for out in (src, tmp_path / "hard.jsonl", tmp_path / "link.jsonl", Path(os.path.relpath(src))):
        line = one_error_line(credit(src, "-o", out))
        assert line == f"error: -o {out}: is the same file as the input {src}; write to another file"
    line = one_error_line(credit(src, "-o", tmp_path / "o.jsonl", "--milestones", tmp_path / "o.jsonl"))
    assert "--milestones" in line and f"is the same file as -o {tmp_path / 'o.jsonl'}" in line
    line = one_error_line(credit(src, "-o", tmp_path / "o.jsonl", "--milestones", src))
    assert "--milestones" in line and "is the same file as the input" in line
    assert listing(tmp_path) == before


@pytest.mark.parametrize("option", ["-o", "--milestones"])
def test_credit_bad_output_paths_are_one_line_and_leave_nothing(tmp_path, option):
    src = rollouts_file(tmp_path / "r.jsonl")
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    before = listing(tmp_path)
    cases = {tmp_path / "adir": "is a folder; give a file name",
             tmp_path / "nofolder" / "o.jsonl": f"folder {tmp_path / 'nofolder'} does not exist",
             tmp_path / "afile" / "o.jsonl": f"{tmp_path / 'afile'} is a file, not a folder"}
    for path, reason in cases.items():
        args = ["-o", path] if option == "-o" else ["-o", tmp_path / "o.jsonl", "--milestones", path]
        line = one_error_line(credit(src, *args))
        assert line.startswith(f"error: {option} {path}: ") and line.endswith(reason), line
        assert listing(tmp_path) == before  # no output, no temp file


def test_credit_output_in_an_unwritable_folder_is_refused(tmp_path):
    src = rollouts_file(tmp_path / "r.jsonl")
    locked = tmp_path / "locked"
    locked.mkdir()
    with unwritable(locked):
        line = one_error_line(credit(src, "-o", locked / "o.jsonl"))
    assert line == f"error: -o {locked / 'o.jsonl'}: cannot be written: {locked} is not writable"
    assert list(locked.iterdir()) == []


def test_new_outputs_follow_the_umask_and_replaced_ones_keep_their_mode(tmp_path):
    src = rollouts_file(tmp_path / "r.jsonl")
    old = os.umask(0o022)
    try:
        assert credit(src, "-o", tmp_path / "a.jsonl").exit_code == 0
        os.umask(0o027)
        assert credit(src, "-o", tmp_path / "b.jsonl", "--milestones", tmp_path / "b.json").exit_code == 0
        (tmp_path / "kept.jsonl").write_text("old\n")
        (tmp_path / "kept.jsonl").chmod(0o604)
        assert credit(src, "-o", tmp_path / "kept.jsonl").exit_code == 0
    finally:
        os.umask(old)
    modes = {p: stat.S_IMODE((tmp_path / p).stat().st_mode) for p in ("a.jsonl", "b.jsonl", "b.json", "kept.jsonl")}
    assert modes == {"a.jsonl": 0o644, "b.jsonl": 0o640, "b.json": 0o640, "kept.jsonl": 0o604}
    assert (tmp_path / "kept.jsonl").read_text() == (tmp_path / "a.jsonl").read_text()


# --- rollout --record is checked before the evaluation (item 3) ---------------------------------

def test_rollout_record_is_checked_before_the_evaluation(tmp_path):
    """The run has no checkpoint: a check made after the evaluation started would fail on that
    instead. Nothing is stored."""
    db = tmp_path / "milegpo.db"
    with RunStore(db) as store:
        store.create_run("r", "grpo", config={"store": {"root": str(tmp_path)}})
    (tmp_path / "afile").write_text("x")
    for record, reason in ((tmp_path / "no" / "r.jsonl", "does not exist"),
                           (tmp_path / "afile" / "r.jsonl", "is a file, not a folder"),
                           (tmp_path, "is a folder; give a file name"),
                           (db, f"is the same file as the store {db}")):
        line = one_error_line(runner.invoke(app, ["rollout", "--run", "1", "-n", "1", "--record", str(record),
                                                  "--runs-dir", str(tmp_path)]))
        assert line.startswith(f"error: --record {record}: ") and reason in line, line
    with RunStore(db) as store:
        assert store.evaluations(1) == []
    assert not (tmp_path / "no").exists() and (tmp_path / "afile").read_text() == "x"


# --- stores: read-only, damaged, missing (items 7, 8, 9) ----------------------------------------

READ_COMMANDS = [["runs"], ["runs", "--json"], ["runs", "show", "1"], ["runs", "show", "1", "--json"],
                 ["report", "--json"], ["compare", "1", "2", "--json"]]


@pytest.mark.parametrize("locked", ["file and folder", "file"])
def test_a_read_only_store_is_read(tmp_path, locked):
    runs = tmp_path / "runs"
    runs.mkdir()
    store_with_runs(runs / "milegpo.db")
    expected = {}
    for args in READ_COMMANDS:
        result = runner.invoke(app, [*args, "--runs-dir", str(runs), *(["--out", str(tmp_path / "p1")]
                                                                       if args[0] in ("report", "compare") else [])])
        assert result.exit_code == 0, result.output
        expected[" ".join(args)] = result.stdout.replace("p1", "PLOTS")
    before, names = (runs / "milegpo.db").read_bytes(), sorted(os.listdir(runs))
    with unwritable(runs / "milegpo.db", *([runs] if locked == "file and folder" else [])):
        assert not os.access(runs / "milegpo.db", os.W_OK)
        for args in READ_COMMANDS:
            out = ["--out", str(tmp_path / "p2")] if args[0] in ("report", "compare") else []
            result = runner.invoke(app, [*args, "--runs-dir", str(runs), *out])
            assert result.exit_code == 0, (args, result.output)
            assert result.stdout.replace("p2", "PLOTS") == expected[" ".join(args)]
        if locked == "file and folder":  # plots into the read-only run folder: one line naming --out
            line = one_error_line(runner.invoke(app, ["report", "--runs-dir", str(runs)]))
            assert "cannot write the plot" in line and "--out" in line
        # a command that writes the store says it cannot
        line = one_error_line(runner.invoke(app, ["train", "--resume", "1", "--runs-dir", str(runs)]))
        assert line.startswith(f"error: cannot use store sqlite:///{runs / 'milegpo.db'}: ")
        assert sorted(os.listdir(runs)) == names  # nothing created (plots went to --out)
    assert (runs / "milegpo.db").read_bytes() == before


def test_a_read_only_store_of_an_older_schema_is_refused_not_upgraded(tmp_path):
    from test_store import write_v1_store

    db = tmp_path / "milegpo.db"
    write_v1_store(f"sqlite:///{db}")
    before = db.read_bytes()
    with unwritable(db, tmp_path):
        line = one_error_line(runner.invoke(app, ["runs", "--runs-dir", str(tmp_path)]))
    assert "has schema version 1 and is read-only here" in line
    assert db.read_bytes() == before
    assert runner.invoke(app, ["runs", "--runs-dir", str(tmp_path)]).exit_code == 0  # writable: upgraded


def read_without_store(args: list[str]) -> str:
    """The one line on stderr of a read command on a folder without a store: `runs` lists nothing
    (exit 0, a hint), the others fail (exit 2)."""
    result = runner.invoke(app, args)
    if args[0] == "runs" and args[1].startswith("--"):
        assert result.exit_code == 0 and result.stdout.strip()
        (line,) = result.stderr.strip().splitlines()
        return "error: " + line.removesuffix(": no runs yet")
    return one_error_line(result)


@pytest.mark.parametrize("args", [["runs"], ["runs", "--json"], ["runs", "show", "999"], ["report"], ["compare", "1"],
                                  ["diagnose", "1"], ["train", "--resume", "1"], ["rollout", "--run", "1"]])
def test_commands_that_read_never_create_a_store(tmp_path, args):
    missing = tmp_path / "never_existed"
    line = read_without_store([*args, "--runs-dir", str(missing)])
    assert line == f"error: no store at {missing / 'milegpo.db'} (check --runs-dir / --db)"
    empty = tmp_path / "empty.db"
    empty.touch()  # an empty SQLite database: no milegpo tables
    line = read_without_store([*args, "--db", str(empty)])
    assert line == f"error: no store at sqlite:///{empty} (the database holds no milegpo tables)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db"] and empty.stat().st_size == 0


def test_commands_that_read_never_create_a_postgresql_store(postgres_url):
    line = read_without_store(["runs", "--db", postgres_url])
    assert line.startswith("error: no store at postgresql+psycopg://") and "holds no milegpo tables" in line
    from sqlalchemy import create_engine, inspect

    engine = create_engine(postgres_url)
    assert inspect(engine).get_table_names() == []
    engine.dispose()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unusable_stores(tmp_path: Path, full: bytes) -> dict[str, tuple[str, str]]:
    """name -> (--db value, expected start of the message after 'error: ')."""
    (tmp_path / "folder.db").mkdir()
    (tmp_path / "random.db").write_bytes(os.urandom(8192))
    (tmp_path / "notes.db").write_text("these are my notes, not a database\n" * 50)
    cases = {"folder": (str(tmp_path / "folder.db"), f"{tmp_path / 'folder.db'} is a folder, not a store"),
             "random bytes": (str(tmp_path / "random.db"), "store sqlite:///"),
             "text file": (str(tmp_path / "notes.db"), "store sqlite:///"),
             "unknown dialect": ("nosuchdb://u@h/x", "store URL nosuchdb://u@h/x: unknown database kind 'nosuchdb'"),
             "closed port": (f"postgresql+psycopg://u@127.0.0.1:{closed_port()}/x",
                             "cannot use store postgresql+psycopg://u@127.0.0.1:")}
    for cut in (100, 4096, 20000, len(full) - 4096):
        (tmp_path / f"cut{cut}.db").write_bytes(full[:cut])
        cases[f"truncated to {cut}"] = (str(tmp_path / f"cut{cut}.db"), "store sqlite:///")
    return cases


def test_corrupt_foreign_and_unreachable_stores_are_one_line(tmp_path):
    full_db = tmp_path / "full" / "milegpo.db"
    full_db.parent.mkdir()
    store_with_runs(full_db)
    with RunStore(full_db) as store:  # grow it past a few pages
        for i in range(20):
            store.create_run(f"big{i}", "grpo", config={"blob": "x" * 5000})
    (tmp_path / "cases").mkdir()
    cases = unusable_stores(tmp_path / "cases", full_db.read_bytes())
    before = listing(tmp_path)
    for name, (db, message) in cases.items():
        for args in (["runs"], ["runs", "show", "1"], ["train", "-r", "webshop", "--runs-dir", str(tmp_path / "new")]):
            line = one_error_line(runner.invoke(app, [*args, "--db", db]))
            assert line.startswith(f"error: {message}"), (name, line)
            if message == "store sqlite:///":
                assert "is damaged or not a milegpo store" in line, (name, line)
    assert listing(tmp_path) == before  # byte-identical, nothing created (no run folder, no -wal)


def test_a_postgresql_server_that_refuses_is_one_line(postgres_server):
    from sqlalchemy import make_url

    url = make_url(postgres_server.get_uri()).set(drivername="postgresql+psycopg", database="no_such_db")
    line = one_error_line(runner.invoke(app, ["runs", "--db", url.render_as_string(hide_password=False)]))
    assert line.startswith("error: cannot use store postgresql+psycopg://")
    assert 'database "no_such_db" does not exist' in line


@pytest.mark.parametrize("table", ["steps", "runs", "schema_version"])
def test_a_store_missing_a_table_is_damaged_not_recreated(store_url, table):
    from sqlalchemy import create_engine, inspect, text

    with RunStore(store_url) as store:
        store.create_run("r", "grpo")
    engine = create_engine(store_url)
    with engine.begin() as conn:
        conn.execute(text(f"DROP TABLE {table}" + (" CASCADE" if engine.dialect.name == "postgresql" else "")))
    for kwargs in ({}, {"create": False}, {"reader": True}):
        with pytest.raises(StoreError, match="is damaged: ") as err:
            RunStore(store_url, **kwargs)
        assert (f"table(s) {table} missing" if table != "schema_version" else "no schema version") in str(err.value)
    line = one_error_line(runner.invoke(app, ["runs", "--db", store_url]))
    assert "is damaged" in line and "restore it from a copy" in line
    assert table not in inspect(engine).get_table_names()  # not re-created empty
    engine.dispose()


def test_an_old_store_missing_a_table_is_damaged_not_upgraded(store_url):
    from sqlalchemy import create_engine, inspect, text
    from test_store import write_v1_store

    write_v1_store(store_url)
    engine = create_engine(store_url)
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE candidates"))
    with pytest.raises(StoreError, match="is damaged: its upgrade from schema version 1 failed"):
        RunStore(store_url)
    with engine.connect() as conn:  # untouched: still version 1, no table re-created
        assert conn.execute(text("SELECT max(version) FROM schema_version")).scalar() == 1
    assert "candidates" not in inspect(engine).get_table_names()
    engine.dispose()


def test_a_store_damaged_past_its_schema_fails_in_one_line_when_read(tmp_path):
    """Random bytes over the second half of the pages: the schema reads, the first read that meets
    a bad page is one line."""
    db = tmp_path / "milegpo.db"
    with RunStore(db) as store:
        for i in range(30):
            rid = store.create_run(f"run{i}", "grpo", config={"blob": "x" * 2000})
            store.record_iteration(rid, 1, {}, [EpisodeRecord("t", "train", "pick", "g0", k, 1.0, True, 4)
                                                 for k in range(20)])
    blob = bytearray(db.read_bytes())
    pages = len(blob) // 4096
    for page in range(pages // 2, pages):
        blob[page * 4096:(page + 1) * 4096] = os.urandom(4096)
    db.write_bytes(bytes(blob))
    store = RunStore(db, create=False, reader=True)  # opens: sqlite_master is intact
    with pytest.raises(StoreError, match=r"is damaged or not a milegpo store \(database disk image is malformed\)"):
        store.list_runs()
    store.close()
    for args in (["runs"], ["runs", "show", "30"]):
        assert "is damaged or not a milegpo store" in one_error_line(runner.invoke(app, [*args, "--db", str(db)]))


# --- one-line errors (item 10) ------------------------------------------------------------------

def test_huge_run_ids_and_seeds_are_one_line(tmp_path):
    store_with_runs(tmp_path / "milegpo.db")
    for big in (2**63, 2**64 + 5, 10**30):
        for args in (["runs", "show", str(big)], ["train", "--resume", str(big)], ["diagnose", str(big)],
                     ["rollout", "--run", str(big)], ["compare", str(big)]):
            line = one_error_line(runner.invoke(app, [*args, "--runs-dir", str(tmp_path)]))
            assert f"'{big}' not found" in line or f"'{big}' is neither a run nor an experiment" in line, line
        line = one_error_line(runner.invoke(app, ["train", "-r", "webshop", "--seed", str(big),
                                                  "--runs-dir", str(tmp_path / "new")]))
        assert line == f"error: run.seed: out of range (a 64-bit integer, |value| < 2^63), got {big}"
    assert not (tmp_path / "new").exists()


def test_credit_unknown_estimator_drop_and_out_of_range_settings(tmp_path):
    src = rollouts_file(tmp_path / "r.jsonl")
    out = tmp_path / "o.jsonl"
    assert one_error_line(credit(src, "-o", out, "--algo", "nosuch")).startswith(
        "error: --algo: unknown estimator 'nosuch' (allowed: grpo, gigpo, graphgpo, milegpo, hgpo, oracle-milestones)")
    assert "--drop: unknown component(s) ['nosuch']" in one_error_line(credit(src, "-o", out, "--drop", "nosuch"))
    for value in ("1e308", "-1e10"):
        line = one_error_line(credit(src, "-o", out, "--set", f"credit.omega={value}"))
        assert line.startswith("error: credit.omega: must be at most 1e+09 in magnitude")
    line = one_error_line(runner.invoke(app, ["train", "-r", "webshop", "--set", "credit.omega=1e308",
                                              "--runs-dir", str(tmp_path / "new")]))
    assert line.startswith("error: credit.omega: must be at most 1e+09 in magnitude")
    huge = [dict(r, outcome=1e300 * (-1) ** r["rollout"]) for r in ROLLOUTS]  # finite, but their squares are not
    line = one_error_line(credit(rollouts_file(tmp_path / "huge.jsonl", huge), "-o", out))
    assert line == "error: outcome: rollout 0 of group 'g0' has |outcome| 1e+300 > 1e+100 (rescale the scores)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge.jsonl", "r.jsonl"]


@pytest.mark.parametrize("digits, message", [
    (5000, "line 2, field '<json>': unreadable JSON (Exceeds the limit (4300 digits) for integer string conversion"),
    (400, "line 2, field 'outcome': must be a finite number, got an integer of 400 digits")])
def test_an_outcome_written_as_a_huge_integer_is_one_line(tmp_path, digits, message):
    src = tmp_path / "r.jsonl"
    rollouts_file(src)
    lines = src.read_text().splitlines()
    lines[1] = lines[1].replace('"outcome": 1.0', f'"outcome": {"9" * digits}')
    src.write_text("\n".join(lines) + "\n")
    line = one_error_line(credit(src, "-o", tmp_path / "o.jsonl"))
    assert line.startswith(f"error: {message}"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]


@pytest.mark.parametrize("command", [["train", "-r", "webshop"], ["ablate", "-r", "webshop"],
                                     ["policy", "build-base", "-r", "webshop"], ["envs", "generate", "-n", "1"]])
def test_a_runs_folder_that_cannot_be_written_is_one_line(tmp_path, command):
    (tmp_path / "afile").write_text("x")
    locked = tmp_path / "locked"
    locked.mkdir()
    before = listing(tmp_path)
    cases = {tmp_path / "afile" / "runs": f"{tmp_path / 'afile'} is a file, not a folder",
             Path("/proc/milegpo-runs"): "cannot write in /proc (No such file or directory)"}
    for runs_dir, reason in cases.items():
        line = one_error_line(runner.invoke(app, [*command, "--runs-dir", str(runs_dir)]))
        assert line == f"error: --runs-dir {runs_dir}: {reason}"
    with unwritable(locked):
        for runs_dir in (locked, locked / "sub"):
            line = one_error_line(runner.invoke(app, [*command, "--runs-dir", str(runs_dir)]))
            assert line.startswith(f"error: --runs-dir {runs_dir}: cannot write in {locked} (")
    assert listing(tmp_path) == before


# --- envs generate follows the run folder (item 11) ---------------------------------------------

def test_envs_generate_writes_into_the_runs_dir(tmp_path, monkeypatch):
    small = ["--set", "env.alfworld.min_receptacles=4", "--set", "env.alfworld.max_receptacles=6",
             "--set", "env.alfworld.max_objects=5"]
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)  # as in a fresh process
    for where, args, env in (("by-option", ["--runs-dir", str(tmp_path / "by-option")], {}),
                             ("by-env", [], {"MILEGPO_RUNS_DIR": str(tmp_path / "by-env")})):
        result = runner.invoke(app, ["envs", "generate", "-n", "1", *small, *args], env=env)
        assert result.exit_code == 0, result.output
        games = list((tmp_path / where / "alfworld").rglob("game.tw-pddl"))
        assert len(games) == 1 and "/train/00000/" in str(games[0])
    assert list(work.iterdir()) == []  # nothing in the working folder (no runs/, no alfworld_data)


# --- formats users bring (items 13, 14) ---------------------------------------------------------

def test_credit_reads_gzipped_rollouts_by_their_magic_bytes(tmp_path):
    src = rollouts_file(tmp_path / "r.jsonl")
    data = src.read_bytes()
    (tmp_path / "r.jsonl.gz").write_bytes(gzip.compress(data))
    (tmp_path / "named-plain.jsonl").write_bytes(gzip.compress(data))  # gzip whatever the name
    results = []
    for i, path in enumerate((src, tmp_path / "r.jsonl.gz", tmp_path / "named-plain.jsonl")):
        assert credit(path, "-o", tmp_path / f"o{i}.jsonl").exit_code == 0
        results.append((tmp_path / f"o{i}.jsonl").read_text())
    assert results[0] == results[1] == results[2] != ""
    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(data)[:-30])
    line = one_error_line(credit(tmp_path / "cut.jsonl.gz", "-o", tmp_path / "o9.jsonl"))
    assert "field '<gzip>': damaged gzip data (Compressed file ended before the end-of-stream marker" in line
    assert not (tmp_path / "o9.jsonl").exists()


@pytest.mark.parametrize("name", ["rollouts_alfworld.jsonl.gz", "rollouts_webshop.jsonl.gz"])
def test_credit_reads_the_projects_own_gzipped_rollouts(tmp_path, name):
    src = REPO / "bench" / "results" / name
    result = credit(src, "-o", tmp_path / "o.jsonl", "--algo", "gigpo")
    assert result.exit_code == 0, result.output
    with gzip.open(src, "rt") as f:
        steps = sum(len(json.loads(line)["steps"]) for line in f if line.strip())
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == steps > 0


def test_invalid_absent_on_some_steps_is_false(tmp_path):
    """steps[t].invalid, a boolean flag: absent = false; the penalty reaches the flagged step only."""
    from milegpo_cli.interchange import read_rollouts

    rows = [dict(r, steps=[dict(s) for s in r["steps"]]) for r in ROLLOUTS]
    rows[1]["steps"][1]["invalid"] = True  # one flag on one step of one rollout
    explicit = [dict(r, steps=[dict(s, invalid=s.get("invalid", False)) for s in r["steps"]]) for r in rows]
    src, full = rollouts_file(tmp_path / "some.jsonl", rows), rollouts_file(tmp_path / "all.jsonl", explicit)
    assert read_rollouts(src)[1].invalid == [False, True, False] and read_rollouts(src)[0].invalid is None
    outs = []
    for path in (src, full):
        result = credit(path, "-o", tmp_path / "o.jsonl", "--algo", "gigpo", "--set", "invalid_penalty=0.5")
        assert result.exit_code == 0, result.output
        outs.append((tmp_path / "o.jsonl").read_text())
    assert outs[0] == outs[1]
    rollouts_file(tmp_path / "plain.jsonl")
    assert credit(tmp_path / "plain.jsonl", "-o", tmp_path / "p.jsonl", "--algo", "gigpo",
                  "--set", "invalid_penalty=0.5").exit_code == 0
    assert (tmp_path / "p.jsonl").read_text() != outs[0]  # the one flag counted
    rows[1]["steps"][0]["subgoals"] = []  # subgoals stay all-or-none: absent is not "none reached"
    line = one_error_line(credit(rollouts_file(tmp_path / "sub.jsonl", rows), "-o", tmp_path / "o.jsonl"))
    assert line == "error: line 2, field 'steps[1].subgoals': missing (given on other steps of this rollout)"


def test_the_installed_script_prints_one_line_for_a_bad_store(tmp_path):
    """The same through the installed `milegpo` script in a fresh process (no CliRunner)."""
    script = Path(sys.executable).with_name("milegpo")
    if not script.exists():
        pytest.skip("the milegpo script is not installed in this environment")
    (tmp_path / "x.db").write_bytes(os.urandom(4096))
    res = subprocess.run([str(script), "runs", "--db", str(tmp_path / "x.db")], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "is damaged or not a milegpo store (file is not a database)" in res.stderr
