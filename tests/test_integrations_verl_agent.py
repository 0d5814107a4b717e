"""milegpo_cli.integrations.verl_agent: verl-agent step rows in, the project's credit out.

(a) On our own recorded rollouts the adapter equals ``compute_advantages`` broadcast over each
step's response tokens, for every algorithm. (b) With ``algo="gigpo"`` and no config it equals
verl-agent's GiGPO as its paper and README state it, re-stated below from those equations (the
check against verl-agent's own code is bench/verl_agent_parity.py).
"""
import dataclasses
import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from milegpo_cli.credit import ALGORITHMS, CreditConfig, Rollout, RolloutBatch, compute_advantages
from milegpo_cli.integrations.verl_agent import compute_advantage, rows_from_rollouts, verl_agent_config
from milegpo_cli.interchange import parse_rollout

RECORDINGS = Path(__file__).resolve().parents[1] / "bench" / "results"
ROW_KEYS = ("token_level_rewards", "step_rewards", "response_mask", "anchor_obs", "index", "traj_index")


def recorded(env: str, groups: int):
    """The first ``groups`` groups of a recording (real rollouts of our environments)."""
    out, names = [], []
    with gzip.open(RECORDINGS / f"rollouts_{env}.jsonl.gz", "rt") as f:
        for number, line in enumerate(f, start=1):
            r = parse_rollout(line, number)
            if r.group not in names:
                if len(names) == groups:
                    break
                names.append(r.group)
            out.append(r)
    return out


def padded_rows(rollouts, gamma, seed=0, width=12):
    rng = np.random.default_rng(seed)
    n = RolloutBatch.from_rollouts(rollouts).num_steps
    return rows_from_rollouts(rollouts, gamma, rng.integers(1, width + 1, n), max_response_length=width)


def interleave(rows, seed):
    """Shuffle rows across trajectories, keeping each trajectory's rows in step order."""
    rng = np.random.default_rng(seed)
    pos = rng.permutation(len(rows["index"]))
    for traj in np.unique(rows["traj_index"]):
        at = np.flatnonzero(rows["traj_index"] == traj)
        pos[at] = np.sort(pos[at])
    inverse = np.argsort(pos)  # inverse[new position] = old row
    return {k: v[inverse] for k, v in rows.items()}, pos


def call(rows, *args, **kw):
    return compute_advantage(*(rows[k] for k in ROW_KEYS), *args, **kw)


@pytest.mark.parametrize("env", ["alfworld", "webshop"])
@pytest.mark.parametrize("algo", ALGORITHMS)
@pytest.mark.parametrize("make_config", [CreditConfig, verl_agent_config], ids=["default", "verl-agent"])
def test_equals_milegpo_credit_on_recorded_rollouts(env, algo, make_config):
    config = make_config()
    rollouts = recorded(env, groups=4)
    rows = padded_rows(rollouts, config.gamma)
    adv, ret = call(rows, algo=algo, config=config, actions=rows["actions"])
    want = compute_advantages(RolloutBatch.from_rollouts(rollouts), algo, config).advantage
    expect = torch.as_tensor(want)[:, None] * rows["response_mask"]
    assert adv.shape == rows["response_mask"].shape and adv.dtype == torch.float64
    assert torch.equal(adv, ret)
    assert torch.allclose(adv, expect, rtol=0, atol=1e-12)
    assert (adv[rows["response_mask"] == 0] == 0).all()
    assert np.abs(want).max() > 0  # the comparison is not between zeros


def test_interleaved_rows_and_drop():
    rollouts = recorded("alfworld", groups=3)
    config = CreditConfig()
    rows = padded_rows(rollouts, config.gamma, seed=1)
    shuffled, pos = interleave(rows, seed=2)
    assert not np.array_equal(pos, np.arange(len(pos)))
    for drop in ((), ("progress",)):
        adv, _ = call(shuffled, algo="milegpo", config=config, drop=drop, actions=shuffled["actions"])
        want = compute_advantages(RolloutBatch.from_rollouts(rollouts), "milegpo", config, drop).advantage
        assert torch.allclose(adv[pos], torch.as_tensor(want)[:, None] * rows["response_mask"], atol=1e-12)


# --- (b) verl-agent's GiGPO, re-stated from its paper (arXiv 2505.10978, Eqs. 3, 6-8) and README ---

def normalise(values, mean, std, mode, eps):
    return values - mean if mode == "mean_norm" else (values - mean) / (std + eps)


def gigpo_as_documented(token_level_rewards, step_rewards, response_mask, anchor_obs, index, epsilon, w, mode):
    """Episode part: the row's total reward normalised over all step rows of its group (a group
    of one row: mean 0, std 1). Step part: the row's discounted return normalised within the rows
    of its group with the same anchor observation (a singleton: 0). A = A^E + w A^S on every
    response token; std is the unbiased sample std."""
    score = token_level_rewards.sum(-1).numpy()
    ret = step_rewards.numpy()
    episode, step = np.zeros_like(score), np.zeros_like(ret)
    for g in set(index):
        rows = np.flatnonzero(index == g)
        mean, std = (0.0, 1.0) if len(rows) == 1 else (score[rows].mean(), score[rows].std(ddof=1))
        episode[rows] = normalise(score[rows], mean, std, mode, epsilon)
        for obs in set(anchor_obs[rows]):
            same = rows[anchor_obs[rows] == obs]
            if len(same) > 1:
                step[same] = normalise(ret[same], ret[same].mean(), ret[same].std(ddof=1), mode, epsilon)
    return torch.as_tensor(episode + w * step)[:, None] * response_mask


def with_singletons_and_invalid_rows(rollouts, seed=6):
    """Add a group holding one one-step rollout (verl-agent's mean 0 / std 1 rule) and flag a fifth
    of the steps as invalid actions (verl-agent takes 0.1 off their row score and return)."""
    rng = np.random.default_rng(seed)
    flagged = [dataclasses.replace(r, invalid=(rng.random(len(r.states)) < 0.2).tolist()) for r in rollouts]
    return flagged + [Rollout("lonely", 0, ["s"], ["a"], [10.0], 1.0)]


@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
@pytest.mark.parametrize("env", ["alfworld", "webshop"])
def test_gigpo_reproduces_verl_agent(mode, env):
    rollouts = with_singletons_and_invalid_rows(recorded(env, groups=4))
    n = RolloutBatch.from_rollouts(rollouts).num_steps
    rows = rows_from_rollouts(rollouts, 0.95, np.random.default_rng(3).integers(1, 13, n), invalid_penalty=0.1)
    rows, _ = interleave(rows, seed=4)
    adv, _ = call(rows, epsilon=1e-6, step_advantage_w=0.7, mode=mode, algo="gigpo")
    want = gigpo_as_documented(*(rows[k] for k in ROW_KEYS[:5]), 1e-6, 0.7, mode)
    assert torch.allclose(adv, want, rtol=0, atol=1e-8)
    assert want.abs().max() > 1


def test_dtype_device_and_validation():
    rows = padded_rows(recorded("alfworld", groups=2), gamma=0.95)
    f32 = {k: (v.float() if torch.is_tensor(v) else v) for k, v in rows.items()}
    adv, _ = call(f32, algo="gigpo")
    assert adv.dtype == torch.float32
    with pytest.raises(ValueError, match="mode"):
        call(rows, mode="bogus")
    bad = dict(rows, index=rows["index"].copy())
    bad["index"][0] = "elsewhere"
    with pytest.raises(ValueError, match="several groups"):
        call(bad)
    bad = dict(rows, token_level_rewards=rows["token_level_rewards"].clone())
    bad["token_level_rewards"][0, 0] += 1.0
    with pytest.raises(ValueError, match="different episode rewards"):
        call(bad)


def test_similarity_grouping_merges_near_identical_anchors():
    rows = padded_rows(recorded("alfworld", groups=2), gamma=0.95)
    rng = np.random.default_rng(5)
    text = {k: "".join(rng.choice(list("abcdefghij "), 60)) for k in set(rows["anchor_obs"])}
    anchor = np.array([text[k] for k in rows["anchor_obs"]], dtype=object)  # long, mutually dissimilar
    target = max(set(anchor), key=lambda o: np.sum(anchor == o))
    at = np.flatnonzero(anchor == target)
    assert len(at) >= 4
    varied = anchor.copy()
    varied[at[::2]] = target[:-1] + "#"  # one character changed: similarity ratio >= 0.95
    exact, _ = call(dict(rows, anchor_obs=anchor), algo="gigpo")
    split, _ = call(dict(rows, anchor_obs=varied), algo="gigpo")
    merged, _ = call(dict(rows, anchor_obs=varied), 1e-6, 1.0, "mean_norm", True, 0.95, algo="gigpo")
    assert torch.allclose(merged, exact, atol=1e-12)
    assert not torch.allclose(split, exact)
