"""Checkpoints: atomic write, sha256 manifest verified on load, keep-last-K, RNG round trip, and
trainer.pt / rng.pt read as plain data only (a pickled callable is refused, also by `train --resume`)."""
from __future__ import annotations

import json
import random
import sqlite3

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from milegpo_cli.cli import app
from milegpo_cli.policy import Policy
from milegpo_cli.trainer.checkpoint import (MANIFEST, OWNER, CheckpointError, check_owner, claim_folder,
                                            find_checkpoint, folder_owner, latest_checkpoint, list_checkpoints,
                                            load_checkpoint, save_checkpoint, set_rng_state, sha256_file)
from conftest import TINY_MODEL

torch.set_num_threads(1)
CORPUS = ["go to desk 1", "take apple 1 from desk 1", "You are in the middle of a room.", "open fridge 1"]


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    cfg = {"model": "tiny", "tiny": {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
                                     "intermediate_size": 32, "vocab_size": 280}}
    return Policy.from_config(cfg, CORPUS, cache_dir=tmp_path_factory.mktemp("models"), device="cpu")


def trainer_state(policy):
    opt = torch.optim.AdamW(policy.model.parameters(), lr=1e-3)
    policy.model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    return {"optimizer": opt.state_dict(), "updates": 1}


def test_save_load_round_trip_restores_rng_and_state(policy, tmp_path):
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    path = save_checkpoint(tmp_path, 3, policy, trainer_state(policy), {"sampler": {"seed": 5}}, keep=2)
    expected = (torch.rand(3), random.random(), np.random.rand())
    ck = load_checkpoint(path)
    assert ck.iteration == 3 and ck.state["sampler"] == {"seed": 5} and ck.trainer_state["updates"] == 1
    set_rng_state(ck.rng_state)
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1] and np.random.rand() == expected[2]
    loaded = Policy.load(ck.policy_dir, {"model": "tiny"}, device="cpu")
    for a, b in zip(policy.model.state_dict().values(), loaded.model.state_dict().values()):
        assert torch.equal(a, b)


def test_keep_last_k_and_half_written_checkpoints_are_ignored(policy, tmp_path):
    state = trainer_state(policy)
    for it in (1, 2, 3, 4):
        save_checkpoint(tmp_path, it, policy, state, {}, keep=2)
    assert [i for i, _ in list_checkpoints(tmp_path)] == [3, 4]
    # a writer killed mid-write leaves a temp folder, and a folder without manifest is incomplete
    (tmp_path / ".tmp-iter_000005-999").mkdir()
    (tmp_path / "iter_000006").mkdir()
    assert latest_checkpoint(tmp_path).iteration == 4
    save_checkpoint(tmp_path, 5, policy, state, {}, keep=2)
    assert not list(tmp_path.glob(".tmp-*"))  # stale temp folders swept
    assert find_checkpoint(tmp_path, None).iteration == 5
    with pytest.raises(CheckpointError, match=r"no checkpoint for iteration 2 .*have \[4, 5\]"):
        find_checkpoint(tmp_path, 2)


def test_a_checkpoint_folder_belongs_to_one_run(policy, tmp_path):
    """Run 1 of two stores in one run folder: the second is refused before it writes, the first goes on."""
    ours, legacy = tmp_path / "run_1", tmp_path / "legacy"
    claim_folder(ours, "mlflow-a", fresh=True)
    assert folder_owner(ours) == "mlflow-a"
    path = save_checkpoint(ours, 2, policy, trainer_state(policy), {}, keep=2)
    digest = sha256_file(path / "trainer.pt")
    for owner, fresh in (("mlflow-b", True), ("mlflow-b", False), (None, False)):
        with pytest.raises(CheckpointError, match="another run|never started"):
            claim_folder(ours, owner, fresh) if owner else check_owner(ours, owner)
    claim_folder(ours, "mlflow-a", fresh=False)  # the owner resumes
    assert [i for i, _ in list_checkpoints(ours)] == [2] and sha256_file(path / "trainer.pt") == digest
    assert folder_owner(ours) == "mlflow-a" and sorted(p.name for p in ours.iterdir()) == ["iter_000002", OWNER]

    # a folder written before owners were recorded: its run resumes it; a new run does not take it
    save_checkpoint(legacy, 1, policy, trainer_state(policy), {}, keep=1)
    with pytest.raises(CheckpointError, match="no run of this store wrote"):
        claim_folder(legacy, "mlflow-new", fresh=True)
    assert folder_owner(legacy) is None
    claim_folder(legacy, "mlflow-old", fresh=False)
    assert folder_owner(legacy) == "mlflow-old"
    check_owner(tmp_path / "absent", None)  # an unstarted run without a folder: nothing to refuse


def test_tampered_checkpoint_is_refused(policy, tmp_path):
    path = save_checkpoint(tmp_path, 1, policy, trainer_state(policy), {}, keep=1)
    weights = next((path / "policy").rglob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256 mismatch for policy/"):
        load_checkpoint(path)
    (path / "extra.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="extra"):
        latest_checkpoint(tmp_path)


def test_same_iteration_rewritten_replaces_it(policy, tmp_path):
    state = trainer_state(policy)
    save_checkpoint(tmp_path, 2, policy, state, {"v": 1}, keep=3)
    save_checkpoint(tmp_path, 2, policy, state, {"v": 2}, keep=3)
    assert len(list_checkpoints(tmp_path)) == 1 and latest_checkpoint(tmp_path).state["v"] == 2
    with pytest.raises(CheckpointError, match="keep"):
        save_checkpoint(tmp_path, 3, policy, state, {}, keep=0)


class Payload:
    """Pickles as a call of ``open(marker, "w")``: loading it unsafely creates ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def plant(checkpoint, name: str, payload) -> None:
    """Add ``payload`` to ``name`` in a checkpoint and re-sign the manifest, as an attacker would."""
    state = torch.load(checkpoint / name, weights_only=False)
    torch.save({**state, "extra": payload}, checkpoint / name)
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    manifest["files"][name] = sha256_file(checkpoint / name)
    (checkpoint / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("name", ["trainer.pt", "rng.pt"])
def test_pickled_callable_is_refused(policy, tmp_path, name):
    path = save_checkpoint(tmp_path / "ck", 1, policy, trainer_state(policy), {}, keep=1)
    marker = tmp_path / "pwned"
    plant(path, name, Payload(marker))
    refused = rf"{name} holds more than tensors and plain data, refused \(it imports io.open\)"
    with pytest.raises(CheckpointError, match=refused):
        load_checkpoint(path)
    assert not marker.exists()


@pytest.mark.slow
def test_train_resume_refuses_a_tampered_trainer_state(tmp_path):
    """Train 1 iteration, plant a callable in trainer.pt (manifest re-signed): `train --resume` exits
    2 with one line, runs nothing, and leaves the store as it was."""
    tiny = [*TINY_MODEL,
            "rollout.groups=2", "rollout.group_size=2", "rollout.train_tasks=8",
            "base.enabled=false", "eval.probe_states=6",
            "eval.episodes=2", "eval.splits=['id']", "env.max_steps=3", "env.webshop.num_products=300",
            "env.webshop.train_instructions=80", "env.webshop.eval_instructions=8", "run.iterations=1",
            "checkpoint.every=1", "warmstart.enabled=false"]
    runner = CliRunner()
    result = runner.invoke(app, ["train", "-r", "webshop", *[a for kv in tiny for a in ("--set", kv)],
                                 "--runs-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    marker = tmp_path / "pwned"
    plant(tmp_path / "checkpoints" / "run_1" / "iter_000001", "trainer.pt", Payload(marker))
    con = sqlite3.connect(tmp_path / "milegpo.db")
    rows = lambda: [con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # noqa: E731
                    for t in ("iterations", "episodes", "steps", "evaluations", "checkpoints")]
    before = rows()
    result = runner.invoke(app, ["train", "--resume", "1", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: checkpoint "), lines
    assert "trainer.pt holds more than tensors and plain data, refused" in lines[0]
    assert not marker.exists() and rows() == before
    con.close()
