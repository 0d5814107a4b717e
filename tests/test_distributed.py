"""Data parallel over processes (issue 18): `accelerate launch` with 2 CPU processes (gloo). Each
rank plays its own groups, gradients are averaged, the weights stay identical on every rank after
each update (checked by a checksum every iteration), and rank 0 writes one run with everyone's
episodes. The test launches with the issue's own command, `--cpu --num_processes 2`: accelerate 1.16
starts several CPU processes only through mpirun, so milegpo relaunches itself under torchrun
(milegpo_cli/relaunch.py)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from milegpo_cli.relaunch import requested_cpu_processes
from milegpo_cli.store import RunStore
from conftest import TINY_MODEL

REPO = Path(__file__).resolve().parents[1]
TINY = [*TINY_MODEL,
        "rollout.groups=2", "rollout.group_size=2", "eval.episodes=2",
        "eval.splits=['id']", "eval.probe_states=4", "warmstart.enabled=false", "base.enabled=false",
        "rollout.train_tasks=8", "env.max_steps=4", "env.alfworld.workers=0", "ppo.minibatch_size=8",
        f"env.alfworld.data_dir={json.dumps(str(REPO / 'runs' / 'alfworld'))}"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_play_their_own_groups_and_keep_identical_weights(tmp_path):
    pytest.importorskip("alfworld")
    if not getattr(__import__("torch").distributed, "is_gloo_available", lambda: False)():
        pytest.skip("torch without gloo")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ALFWORLD_DATA": str(REPO / "runs" / "alfworld_data"),
           "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
           "-m", "milegpo_cli", "train", "--recipe", "alfworld", "--iterations", "2",
           *[x for s in TINY for x in ("--set", s)]]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

    store = RunStore(tmp_path / "runs" / "milegpo.db")
    (run,) = store.list_runs()
    assert run["status"] == "finished"
    iterations = store.iterations(run["id"])
    assert [i["iteration"] for i in iterations] == [1, 2]
    for it in iterations:
        m = it["metrics"]
        assert m["world_size"] == 2 and m["weights_equal_across_ranks"] == 1.0
        assert it["episodes"] == m["episodes"] == 2 * 2 * 2  # K x G x N
        episodes = store.episodes(run["id"], iteration=it["iteration"])
        assert len(episodes) == 8
        groups = {}
        for e in episodes:
            groups.setdefault(e["group"], set()).add(e["task_id"])
        assert len(groups) == 4 and all(len(t) == 1 for t in groups.values())  # 4 groups, one task each
        assert len({t for ts in groups.values() for t in ts}) == 4  # the ranks played different tasks
        assert m["steps"] == sum(e["length"] for e in episodes)
    assert len(store.evaluations(run["id"])) == 2  # start and end, written once (by rank 0)


LAUNCH = ["python", "/venv/bin/accelerate", "launch", "--cpu", "--num_processes", "2", "--num_machines", "1",
          "-m", "milegpo_cli", "train", "--iterations", "1"]
SIMPLE = {"ACCELERATE_USE_CPU": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_the_lone_process_of_a_multi_cpu_launch_asks_for_a_relaunch():
    assert requested_cpu_processes(SIMPLE, LAUNCH) == 2
    module_form = ["python", "-m", "accelerate.commands.launch", *LAUNCH[3:]]
    assert requested_cpu_processes(SIMPLE, module_form) == 2


def test_no_relaunch_for_one_process_a_started_rank_or_another_launcher():
    assert requested_cpu_processes(SIMPLE, [*LAUNCH[:4], "--num_processes", "1", *LAUNCH[6:]]) == 1
    assert requested_cpu_processes({**SIMPLE, "WORLD_SIZE": "2", "RANK": "1"}, LAUNCH) == 1  # torchrun's child
    assert requested_cpu_processes({**SIMPLE, "PMI_SIZE": "2"}, LAUNCH) == 1  # mpirun's child
    assert requested_cpu_processes({**SIMPLE, "ACCELERATE_USE_CPU": "False"}, LAUNCH) == 1
    assert requested_cpu_processes(SIMPLE, ["python", "-m", "milegpo_cli", "train"]) == 1
    two_machines = [*LAUNCH[:6], "--num_machines", "2", *LAUNCH[8:]]
    assert requested_cpu_processes(SIMPLE, two_machines) == 1
