"""The CLI through Typer's CliRunner and as a subprocess of the installed ``milegpo`` script."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from milegpo_cli.cli import app
from milegpo_cli.store import EpisodeRecord, RunStore

COMMANDS = ("train", "rollout", "credit", "diagnose", "ablate", "sweep", "compare", "report", "runs", "ui", "envs")
runner = CliRunner()
SCRIPT = Path(sys.executable).with_name("milegpo")  # installed next to the interpreter by `pip install -e .`


def run_script(*args, cwd, env=None):
    return subprocess.run([str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "120", **(env or {})})


def test_help_lists_every_command():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for name in COMMANDS:
        assert name in result.output


@pytest.mark.parametrize("command", [c for c in COMMANDS if c not in ("runs", "envs")] + ["runs show", "envs generate"])
def test_every_command_has_help(command):
    result = runner.invoke(app, [*command.split(), "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_runs_on_empty_store_prints_empty_table(tmp_path):
    RunStore(tmp_path / "milegpo.db").close()
    result = runner.invoke(app, ["runs", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "runs" in result.output and "status" in result.output


def test_runs_lists_and_shows_a_run(tmp_path):
    db = tmp_path / "x.db"
    with RunStore(db) as store:
        rid = store.create_run("alfworld-gigpo-s2", "gigpo", seed=2, drop=["progress"])
        store.record_iteration(rid, 1, {}, [EpisodeRecord("t", "train", "pick", "g0", i, 1.0, True, 4) for i in range(2)])
        store.record_evaluation(rid, "ood", {}, [EpisodeRecord("t", "ood", "pick", "e", 0, 0.0, False, 9)], iteration=1)
    listed = runner.invoke(app, ["runs", "--db", f"sqlite:///{db}"], env={"COLUMNS": "160"})
    assert listed.exit_code == 0, listed.output
    assert "alfworld-gigpo-s2" in listed.output and "100.0%" in listed.output and "progress" in listed.output
    shown = runner.invoke(app, ["runs", "show", str(rid)], env={"MILEGPO_DB": str(db), "COLUMNS": "160"})
    assert shown.exit_code == 0, shown.output
    assert "gigpo" in shown.output and "ood" in shown.output and "0.0%" in shown.output


def test_unknown_run_is_one_line_exit_2(tmp_path):
    RunStore(tmp_path / "milegpo.db").close()
    result = runner.invoke(app, ["runs", "show", "99", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [f"error: run '99' not found in sqlite:///{tmp_path}/milegpo.db"]


@pytest.mark.parametrize("args, message", [
    (["--set", "ppo.lrr=1"], "error: unknown key 'ppo.lrr' (allowed: lr,"),
    (["--set", "ppo.lr=abc"], "error: ppo.lr: expected float, got 'abc'"),
    (["--algo", "ppo"], "error: run.algo: expected one of 'grpo', 'gigpo', 'graphgpo', 'milegpo', 'hgpo', got 'ppo'"),
    (["--iterations", "0"], "error: run.iterations: must be >= 1, got 0"),
    (["--drop", "everything"], "error: credit.drop: unknown component"),
    (["--recipe", "nope"], "error: recipe 'nope' not found"),
])
def test_bad_train_input_is_one_line_exit_2(tmp_path, args, message):
    result = runner.invoke(app, ["train", *args, "--runs-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), lines
    assert not (tmp_path / "milegpo.db").exists()  # nothing written for a bad config


def test_installed_script_help_and_empty_runs(tmp_path):
    assert SCRIPT.exists(), f"console script missing: {SCRIPT}"
    result = run_script("--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for name in COMMANDS:
        assert name in result.stdout
    result = run_script("runs", cwd=tmp_path)  # the default store, ./runs/milegpo.db: none yet, none created
    assert result.returncode == 0 and not (tmp_path / "runs").exists()
    assert result.stderr.strip() == "no store at runs/milegpo.db (check --runs-dir / --db): no runs yet"
    RunStore(tmp_path / "runs" / "milegpo.db").close()
    result = run_script("runs", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "status" in result.stdout


def test_installed_script_bad_set(tmp_path):
    result = run_script("train", "--set", "rollout.group_size=-1", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["error: rollout.group_size: must be >= 1, got -1"]
    assert "Traceback" not in result.stderr + result.stdout


def test_installed_script_env_var_db(tmp_path):
    db = tmp_path / "elsewhere.db"
    with RunStore(db) as store:
        store.create_run("there", "grpo")
    result = run_script("runs", cwd=tmp_path, env={"MILEGPO_DB": f"sqlite:///{db}"})
    assert result.returncode == 0, result.stderr
    assert "there" in result.stdout and not (tmp_path / "runs").exists()


def rollouts_file(path, bad_line=False):
    lines = ['{"group": "g", "rollout": %d, "outcome": %d, "steps": [{"state": "s0", "action": "a%d", "reward": 0},'
             ' {"state": "s1", "action": "b", "reward": %d}]}' % (i, i % 2, i % 2, 10 * (i % 2)) for i in range(4)]
    if bad_line:
        lines.insert(2, '{"group": "g", "rollout": 9, "outcome": "high", "steps": []}')
    path.write_text("\n".join(lines) + "\n")
    return path


def test_credit_writes_one_line_per_step(tmp_path):
    pytest.importorskip("milegpo_cli.interchange")
    out = tmp_path / "adv.jsonl"
    result = runner.invoke(app, ["credit", str(rollouts_file(tmp_path / "r.jsonl")), "-o", str(out),
                                 "--algo", "gigpo", "--set", "credit.gamma=0.9"])
    assert result.exit_code == 0, result.output
    assert len(out.read_text().splitlines()) == 8


@pytest.mark.parametrize("bad_line, sets, message", [
    (True, [], "error: line 3, field 'outcome'"),
    (False, ["credit.gammma=0.9"], "error: unknown key 'credit.gammma' (allowed:"),
    (False, ["gamma=7"], "error: credit.gamma: must be in"),
])
def test_credit_bad_input_is_one_line_exit_2(tmp_path, bad_line, sets, message):
    pytest.importorskip("milegpo_cli.interchange")
    out = tmp_path / "adv.jsonl"
    args = ["credit", str(rollouts_file(tmp_path / "r.jsonl", bad_line)), "-o", str(out)]
    result = runner.invoke(app, [*args, *[x for s in sets for x in ("--set", s)]])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), lines
    assert not out.exists()


def test_credit_oracle_milestones_needs_subgoals_in_the_file(tmp_path):
    path, out = rollouts_file(tmp_path / "r.jsonl"), tmp_path / "adv.jsonl"
    args = ["credit", str(path), "-o", str(out), "--algo", "oracle-milestones"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        "error: line 1, field 'steps[0].subgoals': missing: --algo oracle-milestones needs the true subgoals newly "
        "reached at every step (docs/rollouts.md)"]
    assert not out.exists()
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    for row in rows:  # the winners reach subgoal "found" on their last step
        for step in row["steps"]:
            step["subgoals"] = ["found"] if step["reward"] else []
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["milestone"] for x in lines] == [False, False, False, True] * 2


# --- --json: one document on stdout, nothing else there (docs/cli.md) -----------------------------
def test_runs_json_is_a_list_empty_on_an_empty_store(tmp_path):
    RunStore(tmp_path / "milegpo.db").close()
    result = runner.invoke(app, ["runs", "--json", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == []


def test_runs_and_runs_show_json(tmp_path):
    db = tmp_path / "x.db"
    with RunStore(db) as store:
        rid = store.create_run("alfworld-gigpo-s2", "gigpo", seed=2, drop=["progress"], config={"run": {"seed": 2}})
        store.record_iteration(rid, 1, {"approx_kl": 0.01},
                               [EpisodeRecord("t", "train", "pick", "g0", i, 1.0, True, 4) for i in range(2)])
        store.record_evaluation(rid, "id", {}, [EpisodeRecord("t", "id", "pick", "e", i, float(i < 3), i < 3, 9)
                                                for i in range(10)], iteration=0)
        store.record_evaluation(rid, "ood", {"probe": 0.5}, [EpisodeRecord("t", "ood", "pick", "e", 0, 0.0, False, 9)],
                                iteration=1)
    env = {"MILEGPO_DB": str(db), "COLUMNS": "80"}
    listed = runner.invoke(app, ["runs", "--json"], env=env)
    assert listed.exit_code == 0, listed.output
    (row,) = json.loads(listed.stdout)
    assert row["id"] == rid and row["drop"] == ["progress"] and row["iterations"] == 1
    assert row["last_success_rate"] == 1.0 and row["created_at"].startswith("20")
    shown = runner.invoke(app, ["runs", "show", str(rid), "--json"], env=env)
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.stdout)
    assert set(doc) == {"run", "iterations", "evaluations"}
    assert doc["run"]["name"] == "alfworld-gigpo-s2" and doc["run"]["config"] == {"run": {"seed": 2}}
    (it,) = doc["iterations"]
    assert {k: it[k] for k in ("iteration", "episodes", "success_rate")} == {"iteration": 1, "episodes": 2,
                                                                                "success_rate": 1.0}
    assert it["metrics"]["approx_kl"] == 0.01 and "mean_outcome" in it
    first, second = doc["evaluations"]
    assert (first["iteration"], first["phase"], first["split"], first["episodes"]) == (0, "untrained", "id", 10)
    assert first["success_rate"] == pytest.approx(0.3)
    assert first["success_ci"] == pytest.approx([0.1078, 0.6032], abs=1e-4)  # Wilson, 3 of 10
    assert (second["phase"], second["metrics"]) == ("train", {"probe": 0.5})
    table = runner.invoke(app, ["runs", "show", str(rid)], env=env)
    assert "untrained" in table.stdout and "10.8-60.3%" in table.stdout  # the same interval, in the table


def experiment_store(db):
    with RunStore(db) as store:
        exp = store.create_experiment("e")
        for algo, wins in (("gigpo", 1), ("milegpo", 2)):
            rid = store.create_run(f"{algo}-s0", algo, seed=0, experiment_id=exp,
                                   config={"env": {"name": "alfworld"}, "store": {"root": str(db.parent)}})
            store.record_iteration(rid, 1, {"steps": 10.0})
            for split in ("id", "ood"):
                store.record_evaluation(rid, split, {}, [EpisodeRecord(f"{split}{i}", split, "pick", "e", 0,
                                                                       float(i < wins), i < wins, 5)
                                                         for i in range(4)], iteration=1)
            store.set_status(rid, "finished")  # report reads finished runs only
    return exp


@pytest.mark.parametrize("args", [["report", "--json"], ["report", "--format", "json"], ["compare", "1", "2", "--json"]])
def test_report_and_compare_json(tmp_path, args):
    experiment_store(tmp_path / "x.db")
    result = runner.invoke(app, [*args, "--db", str(tmp_path / "x.db"), "--out", str(tmp_path / "plots")],
                           env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["plots"] and all(Path(p).exists() for p in doc["plots"])
    if args[0] == "report":
        assert doc["methods"]["milegpo"]["metrics"]["success"]["id"]["mean"]["value"] == 0.5
        assert doc["methods"]["milegpo"]["episodes"] == {"id": [4], "ood": [4]}
    else:
        assert [r["method"] for r in doc["runs"]] == ["gigpo", "milegpo"]
        assert doc["runs"][1]["id"]["final_success"] == 0.5


def test_json_and_another_format_is_a_usage_error(tmp_path):
    result = runner.invoke(app, ["report", "--json", "--format", "md", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: --json and --format md exclude each other"


# --- help text ----------------------------------------------------------------------------------
@pytest.mark.parametrize("command", [c for c in COMMANDS if c not in ("runs", "envs")] + ["runs", "runs show",
                                                                                       "envs generate"])
def test_help_has_plain_metavars_and_every_default(command):
    result = runner.invoke(app, [*command.split(), "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    text = result.output
    assert not re.search(r"<(str|int|bool|path|file|list\[\w+\])>", text), text
    assert "  key" not in text and "store ." not in text  # nothing eaten as markup
    assert all(len(line) <= 80 for line in text.splitlines())
    options = [o for o in re.split(r"\n(?=  -)", text.split("Options:", 1)[1].split("Commands:")[0]) if o.strip()]
    assert options
    for opt in options:  # every option that takes a value and is not required shows its default
        takes_value = re.match(r"\s*(-\w+, )?--?[\w-]+ \S+", opt)
        if takes_value and "[required]" not in opt:
            assert "default:" in " ".join(opt.split()), opt


def test_command_list_is_not_cut_at_80_columns():
    result = runner.invoke(app, ["--help"], env={"COLUMNS": "80"})
    assert "..." not in result.output.split("Commands:", 1)[1]


# --- credit: INPUT or --input, all-zero step rewards ---------------------------------------------
def test_credit_takes_input_as_option_or_argument(tmp_path):
    rollouts = rollouts_file(tmp_path / "r.jsonl")
    by_option = runner.invoke(app, ["credit", "--input", str(rollouts), "-o", str(tmp_path / "a.jsonl")])
    by_argument = runner.invoke(app, ["credit", str(rollouts), "-o", str(tmp_path / "b.jsonl")])
    assert by_option.exit_code == by_argument.exit_code == 0, by_option.output + by_argument.output
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text() != ""
    assert "warning" not in by_option.stderr  # the rollouts carry step rewards
    for args in ([], [str(rollouts), "--input", str(rollouts)]):
        result = runner.invoke(app, ["credit", *args, "-o", str(tmp_path / "c.jsonl")])
        assert result.exit_code == 2
        assert result.stderr.strip() == "error: credit: give the rollouts file once, as INPUT or as --input FILE"
    assert "--input FILE" in runner.invoke(app, ["credit", "--help"]).output
    assert "--input FILE" in (Path(__file__).parents[1] / "docs" / "rollouts.md").read_text()


@pytest.mark.parametrize("algo, warned", [("gigpo", True), ("milegpo", True), ("grpo", False)])
def test_credit_warns_once_when_every_step_reward_is_zero(tmp_path, algo, warned):
    path = tmp_path / "r.jsonl"
    path.write_text("".join('{"group": "g", "rollout": %d, "outcome": %d, "steps": [{"state": "s0", "action": "a%d"}]}\n'
                            % (i, i % 2, i % 2) for i in range(4)))
    result = runner.invoke(app, ["credit", str(path), "-o", str(tmp_path / "a.jsonl"), "--algo", algo])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(lines) == int(warned)
    if warned:
        assert "steps[-1].reward" in lines[0] and "every step reward is 0" in lines[0]
        assert "warning" not in result.stdout


def test_ppo_config_error_is_a_user_error():
    from milegpo_cli.errors import MilegpoError
    from milegpo_cli.trainer.ppo import PPOConfigError

    assert issubclass(PPOConfigError, MilegpoError)


def test_ablate_drop_and_no_ablations_exclude_each_other(tmp_path):
    result = runner.invoke(app, ["ablate", "--drop", "traps", "--no-ablations", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "--drop and --no-ablations exclude each other" in result.output
    assert not (tmp_path / "milegpo.db").exists()  # refused before anything is created


@pytest.mark.parametrize("as_json", [False, True])
def test_runs_on_a_folder_without_a_store_lists_nothing_and_creates_nothing(tmp_path, as_json):
    result = runner.invoke(app, ["runs", *(["--json"] if as_json else []), "--runs-dir", str(tmp_path / "none")])
    assert result.exit_code == 0, result.output
    if as_json:
        assert json.loads(result.stdout) == []
    else:
        assert "runs" in result.stdout and "status" in result.stdout
    assert result.stderr.strip().splitlines() == [f"no store at {tmp_path / 'none' / 'milegpo.db'} (check --runs-dir / "
                                                  "--db): no runs yet"]
    assert not (tmp_path / "none").exists()
    shown = runner.invoke(app, ["runs", "show", "1", "--runs-dir", str(tmp_path / "none")])
    assert shown.exit_code == 2 and shown.stderr.startswith("error: no store at")


@pytest.mark.parametrize("args, option", [(["--iterations", "32"], "--iterations 32"), (["--algo", "grpo"], "--algo"),
                                          (["--set", "ppo.lr=0.1"], "--set"), (["--seed", "3"], "--seed")])
def test_resume_refuses_an_option_its_stored_config_fixes(tmp_path, args, option):
    from milegpo_cli.config import load_config

    config = load_config("webshop", [f"store.root={json.dumps(str(tmp_path))}", "run.iterations=2"])
    store = RunStore(tmp_path / "milegpo.db")
    run_id = store.create_run(name="r", algo="milegpo", config=config.to_dict())
    store.close()
    result = runner.invoke(app, ["train", "--resume", str(run_id), *args, "--runs-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --resume: {option} cannot be given: run {run_id}"), lines
    assert RunStore(tmp_path / "milegpo.db").get_run(run_id)["status"] == "created"
