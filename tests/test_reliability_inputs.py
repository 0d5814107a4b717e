"""Hostile and broken inputs (issue 8): every one is answered by one line naming the problem and
exit code 2, with nothing half-written. Recipes and rollout files are fuzzed with hypothesis; the
counts of generated inputs are in docs/reliability.md."""
from __future__ import annotations

import copy
import json
import math
import os
import resource
import sqlite3
import string
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from milegpo_cli.cli import app
from milegpo_cli.config import Config, flatten, load_config, read_recipe
from milegpo_cli.errors import ConfigError
from conftest import TINY_MODEL

runner = CliRunner()
SCRIPT = Path(sys.executable).with_name("milegpo")
RECIPE_EXAMPLES = int(os.environ.get("MILEGPO_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=RECIPE_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))


def one_error_line(result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "Traceback" not in result.output
    return lines[0]


# --- recipes ----------------------------------------------------------------------------------

BASE = read_recipe("webshop")
KEYS = sorted(k for k in flatten(Config().to_dict()) if k != "recipe")
SECTIONS = sorted({k.split(".")[0] for k in KEYS})
TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")), max_size=8)
VALUES = st.recursive(
    st.one_of(st.booleans(), st.integers(-10**6, 10**6), st.sampled_from([0, -1, 1, 2**63]),
              st.floats(allow_nan=True, allow_infinity=True), TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(string.ascii_lowercase, min_size=1, max_size=4), inner, max_size=2)),
    max_leaves=4)
TARGETS = st.one_of(st.sampled_from(KEYS), st.sampled_from([f"{s}.bogus_key" for s in SECTIONS]),
                    st.sampled_from(["nosuch.key", "run.seed.deeper", "env.webshop.bogus"]))
# (key, value): set the key; (key, None): delete it (a recipe may omit any key)
MUTATIONS = st.lists(st.tuples(TARGETS, st.one_of(st.none(), VALUES)), min_size=1, max_size=3)


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"


def to_toml(data: dict, prefix: str = "") -> str:
    """A minimal TOML writer (tables for dicts, inline values otherwise)."""
    plain = [f"{json.dumps(k)} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    tables = [to_toml(v, f"{prefix}{json.dumps(k)}.") for k, v in data.items() if isinstance(v, dict)]
    head = [f"[{prefix[:-1]}]"] if prefix and plain else []
    return "\n".join([*head, *plain, "", *tables])


def mutate(data: dict, key: str, value) -> None:
    node, *path = data, *key.split(".")
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):  # "run.seed.deeper": the parent is a value, replace it by a table
            child = node[part] = {}
        node = child
    if value is None:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value


def check_config_error(err: ConfigError, keys: list[str]) -> None:
    msg = str(err)
    assert msg and "\n" not in msg, msg
    named = [k for k in keys if k.split(".")[0] in msg or k.split(".")[-1] in msg]
    assert named, f"{msg!r} names none of {keys}"


@FUZZ
@given(MUTATIONS)
def test_generated_recipe_files_load_or_fail_in_one_line(mutations):
    data = copy.deepcopy(BASE)
    for key, value in mutations:
        mutate(data, key, value)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "recipe.toml"
        path.write_text(to_toml(data), encoding="utf-8")
        try:
            config = load_config(path)
        except ConfigError as err:
            event("refused")
            check_config_error(err, [k for k, _ in mutations])
        else:
            event("accepted")
            assert Config.from_dict(config.to_dict()) == config


@FUZZ
@given(st.lists(st.tuples(TARGETS, VALUES), min_size=1, max_size=3))
def test_generated_overrides_load_or_fail_in_one_line(overrides):
    try:
        config = load_config("webshop", flags=dict(overrides))
    except ConfigError as err:
        event("refused")
        check_config_error(err, [k for k, _ in overrides])
    else:
        event("accepted")
        assert Config.from_dict(config.to_dict()) == config


RECIPE_TEXT = (Path(__file__).resolve().parents[1] / "recipes" / "webshop.toml").read_text()


@FUZZ
@given(st.integers(0, len(RECIPE_TEXT)), st.integers(0, 40), st.text(alphabet='[]="\n.=x1 {},#\'', max_size=4))
def test_corrupted_recipe_text_is_a_config_error(at, cut, insert):
    text = RECIPE_TEXT[:at] + insert + RECIPE_TEXT[at + cut:]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "recipe.toml"
        path.write_text(text, encoding="utf-8")
        try:
            load_config(path)
        except ConfigError as err:
            event("refused")
            assert str(err) and "\n" not in str(err)
        else:
            event("accepted")


@pytest.mark.parametrize("args, message", [
    (["--set", "run.bogus=1"], "unknown key 'run.bogus'"),
    (["--set", "rollout.groups='four'"], "rollout.groups: expected int"),
    (["--set", "rollout.groups=0"], "rollout.groups: must be >= 1, got 0"),
    (["--set", "ppo.minibatch_size=-8"], "ppo.minibatch_size: must be >= 1, got -8"),
    (["--set", "ppo.max_bad_updates=0"], "ppo.max_bad_updates: must be >= 1, got 0"),
    (["--set", "env.webshop.step_timeout_s=-1"], "env.webshop.step_timeout_s: must be >= 0"),
    (["--set", "eval.splits=['idd']"], "eval.splits: unknown ['idd'] (allowed: train, id, ood)"),
    (["-r", "nowhere/missing.toml"], "recipe file not found: nowhere/missing.toml"),
    (["-r", "{bad}"], "TOML syntax error at line 2"),
])
def test_bad_recipe_on_the_command_line(tmp_path, args, message):
    (tmp_path / "bad.toml").write_text("[run]\nseed = = 3\n")
    args = [a.replace("{bad}", str(tmp_path / "bad.toml")) for a in args]
    if args[0] != "-r":
        args = ["-r", "webshop", *args]
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        line = one_error_line(runner.invoke(app, ["train", *args, "--runs-dir", str(tmp_path / "runs")]))
    finally:
        os.chdir(cwd)
    assert message in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.toml"]  # no store, no run dir


# --- rollout files for `milegpo credit` -------------------------------------------------------

def rollout(group: str, i: int, n_steps: int = 3) -> dict:
    return {"group": group, "rollout": i, "outcome": float(i % 2), "success": bool(i % 2),
            "steps": [{"state": f"s{t}", "action": f"a{(t + i) % 2}", "reward": 10.0 * (i % 2) * (t == n_steps - 1)}
                      for t in range(n_steps)]}


GOOD = [json.dumps(rollout(f"g{g}", i)) for g in range(2) for i in range(4)]
JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True), TEXT,
                        st.lists(st.integers(), max_size=2), st.dictionaries(st.just("state"), TEXT, max_size=1))
FIELDS = ["group", "rollout", "outcome", "success", "steps", "steps.0", "steps.0.state", "steps.1.action",
          "steps.2.reward"]


@st.composite
def broken_line(draw):
    """(line index, text) : a line of GOOD truncated, with a field replaced / removed, or garbage."""
    i = draw(st.integers(0, len(GOOD) - 1))
    kind = draw(st.sampled_from(["truncate", "replace", "remove", "garbage"]))
    if kind == "truncate":
        return i, GOOD[i][:draw(st.integers(0, len(GOOD[i]) - 1))]
    if kind == "garbage":
        return i, draw(st.sampled_from(["NaN", "[1, 2]", '"text"', "{", "\x00\x01", "{\"group\": \"g0\"}"]))
    obj = json.loads(GOOD[i])
    node, *path = obj, *draw(st.sampled_from(FIELDS)).split(".")
    for part in path[:-1]:
        node = node[int(part)] if part.isdigit() else node[part]
    last = int(path[-1]) if path[-1].isdigit() else path[-1]
    if kind == "remove":
        del node[last]
    else:
        node[last] = draw(JSON_VALUES)
    return i, json.dumps(obj)  # json.dumps writes NaN / Infinity literals, which json.loads accepts


@settings(max_examples=RECIPE_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(broken_line(), st.sampled_from(["grpo", "gigpo", "milegpo"]), st.booleans())
def test_broken_rollout_files_fail_in_one_line_and_write_nothing(broken, algo, bad_utf8):
    i, text = broken
    lines = [*GOOD]
    lines[i] = text
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
        raw = [line.encode() for line in lines]
        if bad_utf8:  # a byte that is not UTF-8 at the end of line i + 1
            raw[i] += b"\xff"
        src.write_bytes(b"\n".join(raw) + b"\n")
        result = runner.invoke(app, ["credit", str(src), "-o", str(out), "--algo", algo])
        event(f"exit {result.exit_code}")
        if result.exit_code == 0:
            assert out.exists() and not bad_utf8
            return
        line = one_error_line(result)
        assert f"line {i + 1}," in line or "rollout" in line, line
        assert sorted(p.name for p in Path(tmp).iterdir()) == ["in.jsonl"]  # no output, no temp file


def test_huge_rollout_file_is_streamed(tmp_path):
    """A ~60 MB file whose last line is truncated: the reader streams it, fails at the last line,
    and the peak memory of the process does not grow with the file (validation pass first)."""
    big, small = tmp_path / "big.jsonl", tmp_path / "small.jsonl"
    with open(big, "w") as f:
        for g in range(3000):
            for i in range(8):
                f.write(json.dumps(rollout(f"group-{g}", i, n_steps=60)) + "\n")
        f.write(GOOD[0][:40] + "\n")
    small.write_text(GOOD[0][:40] + "\n")
    lines = big.read_text().count("\n")

    def peak_rss_mb(path: Path) -> tuple[float, subprocess.CompletedProcess]:
        code = ("import resource, sys; from milegpo_cli.cli import main; sys.argv = ['milegpo'] + sys.argv[1:]\n"
                "try:\n    main()\nexcept SystemExit as e:\n"
                "    print('rss', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr); raise")
        res = subprocess.run([sys.executable, "-c", code, "credit", str(path), "-o", str(tmp_path / "o.jsonl")],
                             capture_output=True, text=True, timeout=300)
        rss = [ln for ln in res.stderr.splitlines() if ln.startswith("rss ")]
        return int(rss[-1].split()[1]) / 1024, res

    size_mb = big.stat().st_size / 2**20
    base_mb, res_small = peak_rss_mb(small)
    peak_mb, res = peak_rss_mb(big)
    assert res.returncode == 2, res.stderr
    assert res.stderr.splitlines()[0].startswith(f"error: line {lines}, field '<json>': invalid JSON")
    assert not (tmp_path / "o.jsonl").exists()
    growth = peak_mb - base_mb
    print(f"huge JSONL: {size_mb:.0f} MB file, peak RSS {peak_mb:.0f} MB (baseline {base_mb:.0f} MB, "
          f"growth {growth:.0f} MB = {growth / size_mb:.2f} x file size)")
    assert growth < 0.1 * size_mb  # flat: the bad last line is found before anything is held


# --- runs, stores, checkpoints ----------------------------------------------------------------

@pytest.mark.parametrize("args", [["runs", "show", "999"], ["train", "--resume", "999"], ["rollout", "--run", "nope"],
                                  ["diagnose", "999"]])
def test_unknown_run_is_one_line(tmp_path, args):
    from milegpo_cli.store import RunStore

    RunStore(tmp_path / "milegpo.db").close()
    line = one_error_line(runner.invoke(app, [*args, "--runs-dir", str(tmp_path)]))
    assert "not found" in line and ("999" in line or "nope" in line)
    con = sqlite3.connect(tmp_path / "milegpo.db")
    assert con.execute("SELECT count(*) FROM runs").fetchone() == (0,)
    con.close()


def test_store_from_a_newer_schema_is_refused(tmp_path):
    from milegpo_cli.store import RunStore
    from milegpo_cli.store.models import SCHEMA_VERSION

    with RunStore(tmp_path / "milegpo.db") as store:
        store.create_run(name="old", algo="grpo")
    con = sqlite3.connect(tmp_path / "milegpo.db")
    con.execute("INSERT INTO schema_version (version, created_at) VALUES (?, CURRENT_TIMESTAMP)", (SCHEMA_VERSION + 1,))
    con.commit()
    con.close()
    before = (tmp_path / "milegpo.db").read_bytes()
    for args in (["runs"], ["train", "-r", "webshop"], ["runs", "show", "1"]):
        line = one_error_line(runner.invoke(app, [*args, "--runs-dir", str(tmp_path)]))
        assert f"schema version {SCHEMA_VERSION + 1}, newer than this milegpo supports" in line
    assert (tmp_path / "milegpo.db").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["milegpo.db"]


@pytest.mark.slow
def test_checkpoint_with_a_bad_hash_is_refused(tmp_path):
    """Train 2 iterations, flip one byte of the newest checkpoint: resume and rollout refuse it in
    one line, and the store is left as it was (resume deletes nothing before verifying)."""
    tiny = [*TINY_MODEL,
            "rollout.groups=2", "rollout.group_size=2", "eval.episodes=2",
            "base.enabled=false", "rollout.train_tasks=8", "eval.probe_states=6",
            "eval.splits=['id']", "env.max_steps=3", "env.webshop.num_products=300",
            "env.webshop.train_instructions=80", "env.webshop.eval_instructions=8", "run.iterations=2",
            "checkpoint.every=1", "eval.every=2"]
    result = runner.invoke(app, ["train", "-r", "webshop", *[a for kv in tiny for a in ("--set", kv)],
                                 "--runs-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    ckpt = tmp_path / "checkpoints" / "run_1" / "iter_000002"
    blob = bytearray((ckpt / "trainer.pt").read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    (ckpt / "trainer.pt").write_bytes(bytes(blob))
    con = sqlite3.connect(tmp_path / "milegpo.db")
    rows = lambda: [con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # noqa: E731
                    for t in ("iterations", "episodes", "steps", "evaluations", "checkpoints")]
    before = rows()
    for args in (["train", "--resume", "1"], ["rollout", "--run", "1", "-n", "1"]):
        line = one_error_line(runner.invoke(app, [*args, "--runs-dir", str(tmp_path)]))
        assert "iter_000002: sha256 mismatch for trainer.pt" in line
    assert rows() == before
    con.close()
