"""bench/gpu_check.py at toy size on CPU: one iteration of the paper recipe's code path writes its CSV row."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_toy_writes_the_csv(tmp_path):
    pytest.importorskip("alfworld")
    out = tmp_path / "gpu_check.csv"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_check.py"), "--size", "toy", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    sys.path.insert(0, str(REPO / "bench"))
    from gpu_check import COLUMNS

    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == COLUMNS and [r["size"] for r in rows] == ["toy"]
    row = rows[0]
    assert row["device"] == "cpu" and int(row["episodes"]) == 4
    assert int(row["generated_tokens"]) > 0 and float(row["rollout_tokens_per_s"]) > 0
    assert int(row["update_tokens"]) > 0 and float(row["update_tokens_per_s"]) > 0
    assert float(row["planned_peak_gib"]) > 0 and float(row["peak_gib"]) > 0
