"""The estimators inside verl 0.9.1's real code (its own venv: .ci/verl).

(a) ``import verl`` alone (the ``verl.plugins`` entry point) makes ``algorithm.adv_estimator=<ours>``
resolve. (b) Through verl's own ``compute_advantage`` (the v0 ``ray_trainer`` function and the v1
trainer's ``compute_advantage_for_multi_trajectories``) on real ``DataProto`` batches, per-token
advantages equal ``milegpo credit``'s (the CLI, float64, <= 1e-9) for every estimator, on recorded
ALFWorld and WebShop rollouts. The recordings hold failures and all-fail groups but neither
invalid steps nor singleton groups, so a copy with invalid steps (penalty in their reward, as our
trainer records it) and two singleton groups is checked too.
"""
import dataclasses
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

from milegpo_cli.integrations.verl.estimators import ESTIMATOR_NAMES, turn_fields
from milegpo_cli.integrations.verl.turns import TurnFieldsError, rollout_rows
from milegpo_cli.interchange import read_rollouts, write_rollouts

ROOT = Path(__file__).resolve().parents[2]
RECORDINGS = ROOT / "bench" / "results"
GROUPS = 24


@functools.lru_cache(maxsize=None)
def recording(name: str) -> tuple:
    return tuple(read_rollouts(RECORDINGS / f"rollouts_{name}.jsonl.gz"))


def recorded(name: str, groups: int = GROUPS):
    """The rollouts of the first ``groups`` groups of a recording (real rollouts of our engines)."""
    first = set(list(dict.fromkeys(r.group for r in recording(name)))[:groups])
    return [r for r in recording(name) if r.group in first]


def with_invalid_and_singletons(rollouts, seed=0, penalty=0.1):
    """A tenth of the steps invalid (their reward less ``penalty``), the first two groups cut to one rollout."""
    rng = np.random.default_rng(seed)
    first = list(dict.fromkeys(r.group for r in rollouts))[:2]
    out, kept = [], set()
    for r in rollouts:
        if r.group in first:
            if r.group in kept:
                continue
            kept.add(r.group)
        bad = (rng.random(len(r.states)) < 0.1).tolist()
        out.append(dataclasses.replace(r, invalid=bad, rewards=[w - penalty * b for w, b in zip(r.rewards, bad)]))
    return out


CASES = {"alfworld": lambda: recorded("alfworld_final"), "webshop": lambda: recorded("webshop_final"),
         "alfworld-invalid-singletons": lambda: with_invalid_and_singletons(recorded("alfworld_final")),
         "webshop-invalid-singletons": lambda: with_invalid_and_singletons(recorded("webshop_final"), seed=1)}


def milegpo_credit(tmp_path, rollouts, algo, sets=()):
    """``milegpo credit`` (the CLI, a real process) -> {(group, rollout, t): advantage}."""
    src, dst = tmp_path / f"in-{algo}.jsonl", tmp_path / f"out-{algo}.jsonl"
    write_rollouts(src, rollouts)
    cmd = [sys.executable, "-m", "milegpo_cli", "credit", str(src), "-o", str(dst), "--algo", algo]
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return {(d["group"], str(d["rollout"]), d["t"]): d["advantage"] for d in map(json.loads, dst.read_text().splitlines())}


def turn_batch(rollouts, seed=0, width=9):
    """verl rows of the episodes: shuffled across episodes, right-padded responses of random lengths,
    the episode reward on each row's last response token (as verl's reward loop puts rm_scores)."""
    outcomes, index, fields = rollout_rows(rollouts)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(outcomes))
    lengths = rng.integers(1, width + 1, len(outcomes))
    mask = torch.as_tensor(np.arange(width)[None, :] < lengths[:, None], dtype=torch.float64)
    rewards = torch.zeros(len(outcomes), width, dtype=torch.float64)
    rewards[torch.arange(len(outcomes)), torch.as_tensor(lengths - 1)] = torch.as_tensor(outcomes[perm])
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                               non_tensors={"uid": np.array([index[k] for k in perm], dtype=object)})
    return data, [fields[k] for k in perm]


def expected_tokens(reference, fields, index, mask):
    per_row = torch.tensor([reference[(g, f["milegpo_episode"], f["milegpo_t"])] for g, f in zip(index, fields)],
                           dtype=torch.float64)
    return per_row.unsqueeze(-1) * mask


def test_import_verl_alone_registers_every_estimator():
    code = ("import verl\nfrom verl.trainer.ppo.core_algos import get_adv_estimator_fn\n"
            f"print([get_adv_estimator_fn(n).__module__ for n in {sorted(ESTIMATOR_NAMES)!r}])")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    assert out.strip() == repr(["milegpo_cli.integrations.verl.estimators"] * len(ESTIMATOR_NAMES))
    assert set(ESTIMATOR_NAMES) == {"milegpo", "milegpo_gigpo", "milegpo_graphgpo", "milegpo_hgpo", "milegpo_grpo"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_verl_compute_advantage_equals_milegpo_credit(tmp_path, case):
    rollouts = CASES[case]()
    batch_groups = {r.group for r in rollouts}
    assert any(r.outcome < 1 for r in rollouts) and any(r.outcome >= 1 for r in rollouts)
    assert any(all(r.outcome < 1 for r in rollouts if r.group == g) for g in batch_groups), "no all-fail group"
    if "singletons" in case:
        assert sum(1 for g in batch_groups if sum(r.group == g for r in rollouts) == 1) == 2
        assert any(any(r.invalid) for r in rollouts)
    data, fields = turn_batch(rollouts, seed=len(case))
    index = list(data.non_tensor_batch["uid"])
    for name, algo in ESTIMATOR_NAMES.items():
        want = expected_tokens(milegpo_credit(tmp_path, rollouts, algo), fields, index, data.batch["response_mask"])
        assert want.abs().max() > 0
        for run in (compute_advantage, compute_advantage_for_multi_trajectories):
            extra = {"batch_keys": [f"k_{i}_0" for i in range(len(data))]} if run is not compute_advantage else {}
            with turn_fields(fields):
                out = run(DataProto.from_dict(tensors=dict(data.batch.items()), non_tensors=dict(data.non_tensor_batch)),
                          adv_estimator=name, config=OmegaConf.create({"adv_estimator": name}), **extra)
            diff = (out.batch["advantages"] - want).abs().max().item()
            assert diff <= 1e-9, f"{name} via {run.__module__}: max |diff| {diff}"
            assert torch.equal(out.batch["returns"], out.batch["advantages"])


def test_credit_settings_come_from_algorithm_milegpo_credit(tmp_path):
    rollouts = recorded("alfworld_final", 8)
    data, fields = turn_batch(rollouts)
    index = list(data.non_tensor_batch["uid"])
    sets = {"formulation": "v2", "lambda_p": 1.0, "gamma": 0.9, "drop": ["traps"]}
    want = expected_tokens(milegpo_credit(tmp_path, rollouts, "milegpo", [f"{k}={v}" for k, v in sets.items()]),
                           fields, index, data.batch["response_mask"])
    default = expected_tokens(milegpo_credit(tmp_path, rollouts, "milegpo"), fields, index, data.batch["response_mask"])
    assert (want - default).abs().max() > 1e-3
    with turn_fields(fields):
        out = compute_advantage(data, adv_estimator="milegpo",
                                config=OmegaConf.create({"adv_estimator": "milegpo", "milegpo_credit": sets}))
    assert (out.batch["advantages"] - want).abs().max().item() <= 1e-9
    with turn_fields(fields), pytest.raises(ValueError, match=r"algorithm\.milegpo_credit\.lambda_q: unknown credit key"):
        compute_advantage(data, adv_estimator="milegpo", config=OmegaConf.create({"milegpo_credit": {"lambda_q": 1}}))
    with turn_fields(fields):  # verl's dataclass config (no milegpo_credit): the defaults of `milegpo credit`
        out = compute_advantage(data, adv_estimator="milegpo", config=AlgoConfig(adv_estimator="milegpo"))
    assert (out.batch["advantages"] - default).abs().max().item() <= 1e-9


def test_missing_fields_and_inconsistent_rows_are_one_line_errors():
    data, fields = turn_batch(recorded("alfworld_final", 2))
    estimate = get_adv_estimator_fn("milegpo_gigpo")
    args = dict(token_level_rewards=data.batch["token_level_rewards"], response_mask=data.batch["response_mask"],
                index=data.non_tensor_batch["uid"])
    with pytest.raises(ValueError, match="set trainer.v1.trainer_mode=milegpo_sync"):
        estimate(**args)
    with turn_fields([{k: v for k, v in f.items() if k != "milegpo_action"} for f in fields]), \
            pytest.raises(TurnFieldsError, match=r"extra_fields\.milegpo_action: missing on row 0"):
        estimate(**args)
    rewards = args["token_level_rewards"].clone()
    rewards[0, 0] += 0.5
    with turn_fields(fields), pytest.raises(TurnFieldsError, match=r"extra_fields\.milegpo_reward: row 0 says"):
        estimate(**{**args, "token_level_rewards": rewards})
    without_reward = [{k: v for k, v in f.items() if k != "milegpo_reward"} for f in fields]
    with turn_fields(without_reward), pytest.raises(TurnFieldsError, match="carry different episode rewards"):
        estimate(**{**args, "token_level_rewards": rewards})
    uid = args["index"]
    episode = lambda k: (uid[k], fields[k]["milegpo_episode"])  # noqa: E731
    long = next(k for k in range(len(fields)) if sum(episode(j) == episode(k) for j in range(len(fields))) >= 3)
    keep = [k for k in range(len(fields)) if not (episode(k) == episode(long) and fields[k]["milegpo_t"] == 1)]
    with turn_fields([fields[k] for k in keep]), pytest.raises(TurnFieldsError, match=r"has turns \[0, 2, "):
        estimate(token_level_rewards=args["token_level_rewards"][keep], response_mask=args["response_mask"][keep],
                 index=uid[keep])
