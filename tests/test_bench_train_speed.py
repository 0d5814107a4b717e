"""bench/train_speed.py --contend: busy / idle per iteration part, in one run, at toy size."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import train_speed  # noqa: E402
from results_csv import append_row  # noqa: E402


def test_contend_ratios_per_part():
    idle = {"time_env_s": 1.0, "time_policy_s": 2.0, "time_update_s": 4.0, "iteration_s": 7.0}
    busy = {"time_env_s": 1.5, "time_policy_s": 2.0, "time_update_s": 6.0, "iteration_s": 9.5}
    assert train_speed.contend_ratios(idle, busy) == {"contend_ratio_env": 1.5, "contend_ratio_policy": 1.0,
                                                      "contend_ratio_update": 1.5,
                                                      "contend_ratio_iteration": pytest.approx(9.5 / 7.0)}


def test_spinners_are_other_processes_to_the_load_meter():
    """The neighbours are not the bench's children: the trainer's meter sees them as others' load."""
    from milegpo_cli.cores import LoadMeter

    meter = LoadMeter()
    pids = train_speed.spinners(1)
    try:
        assert len(pids) == 1
        parent = int(Path(f"/proc/{pids[0]}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert parent != os.getpid()  # re-parented: not in the bench's process tree
        meter.others_busy()  # start a window with the neighbour running
        assert meter.others_busy() >= 0.5  # one neighbour keeps about one core busy
    finally:
        train_speed.stop(pids)


@pytest.mark.slow
def test_contend_run_at_toy_size(tmp_path):
    out_csv = tmp_path / "train_speed.csv"
    cmd = [sys.executable, str(ROOT / "bench" / "train_speed.py"), "--iterations", "1", "--contend", "1",
           "--root", str(tmp_path / "runs"), "--results", str(out_csv),
           "--set", "base.enabled=false", "--set", "rollout.groups=1", "--set", "rollout.group_size=2",
           "--set", "env.max_steps=2", "--set", "env.alfworld.workers=0", "--set", "rollout.lanes=1",
           "--set", "run.threads=1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ALFWORLD_DATA": str(tmp_path / "alfworld_data")}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1].startswith("busy/idle with 1 neighbours: env ")
    row = list(csv.DictReader(open(out_csv)))[-1]
    for part in ("env", "policy", "update", "iteration"):
        assert float(row[f"contend_ratio_{part}"]) > 0
    assert row["contend"] == "1" and float(row["contended_iteration_s"]) > 0


def test_contend_must_not_be_negative(capsys):
    with pytest.raises(SystemExit) as e:
        train_speed.main(["--contend", "-1"])
    assert e.value.code == 2 and "--contend" in capsys.readouterr().err


def test_a_results_row_with_new_columns_keeps_the_older_rows(tmp_path):
    path = tmp_path / "results" / "bench.csv"
    append_row(path, {"commit": "a", "ratio": 0.8})
    append_row(path, {"commit": "b", "ratio": 0.7, "packing": 0.6})
    rows = list(csv.DictReader(open(path)))
    assert rows == [{"commit": "a", "ratio": "0.8", "packing": ""}, {"commit": "b", "ratio": "0.7", "packing": "0.6"}]
