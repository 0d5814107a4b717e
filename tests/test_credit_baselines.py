"""GraphGPO's recipe conventions and HGPO (issue 33), pinned on small groups worked out by hand.

The group of the GraphGPO tests (states a, b, c, d, e; SUCCESS written S):
    R0 won:    a -> b -> S            (rewards 0, 10)
    R1 failed: a -> c, ends in b      (final_state "b"; its first step invalid)
    R2 failed: a -> d, ends in e      (final_state "e", a dead end)
With the recorded final states the graph holds a->b, b->S, a->c, c->b, a->d, d->e: d(b) = 1,
d(a) = d(c) = 2, d and e cannot reach S (the largest finite distance is 2, so "farthest" gives them 3).
Without them (graph_final = "fail") c and d lead to FAIL: only a and b reach S.
"""
import json
import math

import numpy as np
import pytest

from milegpo_cli.credit import CreditConfig, Rollout, RolloutBatch, compute_advantages
from milegpo_cli.interchange import read_rollouts, rollout_line, run_credit_file

EPS = 1e-6


def group(final=True):
    return [Rollout("g", 0, ["a", "b"], ["x", "y"], [0.0, 10.0], 1.0, True, [False, False]),
            Rollout("g", 1, ["a", "c"], ["z", "y"], [0.0, 0.0], 0.0, False, [True, False],
                    final_state="b" if final else None),
            Rollout("g", 2, ["a", "d"], ["w", "v"], [0.0, 0.0], 0.0, False, [False, False],
                    final_state="e" if final else None)]


def a_group(cfg):
    """Step advantages of the three steps taken in a (flattened steps 0, 2, 4)."""
    return compute_advantages(RolloutBatch.from_rollouts(group()), "graphgpo", cfg).step_advantage[[0, 2, 4]]


def centred(*r):
    return np.array(r) - np.mean(r)


MEAN = dict(step_norm="mean", graph_gamma=0.2, invalid_penalty=0.1)


OLD = dict(graph_final="fail", **MEAN)  # our convention (the default)


def test_default_convention_sends_failures_to_fail_and_unreachable_to_zero():
    assert CreditConfig().graph_final == "fail" and CreditConfig().graph_unreachable == "zero"
    # returns from a: R0 -> b: 10 * 0.2 = 2; R1 -> c and R2 -> d reach FAIL only: 0
    assert np.allclose(a_group(CreditConfig(**OLD)), centred(2.0, 0.0, 0.0))


def test_graph_final_observed_alone():
    # c -> b (R1's final state) puts c at distance 2: 10 * 0.2^2 = 0.4; d still only reaches e: 0
    assert np.allclose(a_group(CreditConfig(graph_final="observed", **MEAN)), centred(2.0, 0.4, 0.0))


def test_graph_unreachable_farthest_alone():
    # FAIL terminals: finite distances b = 1, a = 2; c and d unreachable -> 2 + 1 = 3: 10 * 0.2^3 = 0.08
    assert np.allclose(a_group(CreditConfig(graph_unreachable="farthest", **OLD)), centred(2.0, 0.08, 0.08))


def test_graph_invalid_alone():
    # R1's first step is invalid: its graph return 0 - 0.1
    assert np.allclose(a_group(CreditConfig(graph_invalid=True, **OLD)), centred(2.0, -0.1, 0.0))


def test_preset_is_the_recipe_on_the_whole_group():
    """recipe/GraphGPO with gamma_G 0.1, mean_std_norm: every step's advantage by hand."""
    g = 0.1
    # graph step returns (10 * g^d(next), unreachable d = 3, less 0.1 on the invalid row)
    r = {"R0t0": 10 * g, "R0t1": 10.0, "R1t0": 10 * g ** 2 - 0.1, "R1t1": 10 * g, "R2t0": 10 * g ** 3, "R2t1": 10 * g ** 3}
    a = [r["R0t0"], r["R1t0"], r["R2t0"]]  # the only anchor group with more than one step: state a
    mean = sum(a) / 3
    std = math.sqrt(sum((x - mean) ** 2 for x in a) / 2)  # unbiased, as torch.std
    step = {"R0t0": (a[0] - mean) / (std + EPS), "R1t0": (a[1] - mean) / (std + EPS), "R2t0": (a[2] - mean) / (std + EPS),
            "R0t1": 0.0, "R1t1": 0.0, "R2t1": 0.0}  # b, c, d: one step each
    rows = [10.0, 10.0, -0.1, 0.0, 0.0, 0.0]  # episode score 10 x success per step row, less the penalty
    m = sum(rows) / 6
    s = math.sqrt(sum((x - m) ** 2 for x in rows) / 5)
    want = [(x - m) / (s + EPS) + step[k] for x, k in zip(rows, ["R0t0", "R0t1", "R1t0", "R1t1", "R2t0", "R2t1"])]
    cfg = CreditConfig(preset="verl-agent", graph_gamma=g, episode_norm="mean_std")
    got = compute_advantages(RolloutBatch.from_rollouts(group()), "graphgpo", cfg).advantage
    assert np.allclose(got, want, rtol=0, atol=1e-12)


def test_farthest_in_a_group_without_success_is_one_everywhere():
    """No rollout won: every state gets d = 0 + 1, the same return, so step advantage 0 (the recipe)."""
    fails = [Rollout("g", i, ["a", "b"], ["x", f"y{i}"], [0.0, 0.0], 0.0, False, final_state=f"e{i}") for i in range(3)]
    res = compute_advantages(RolloutBatch.from_rollouts(fails), "graphgpo", CreditConfig(preset="verl-agent"))
    assert np.allclose(res.step_advantage, 0.0)


def test_final_state_round_trips_and_absent_keeps_the_old_graph(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(rollout_line(r) for r in group()) + "\n")
    assert [r.final_state for r in read_rollouts(path)] == [None, "b", "e"]
    assert json.loads(path.read_text().splitlines()[1])["final_state"] == "b"
    bare = tmp_path / "bare.jsonl"
    bare.write_text("\n".join(rollout_line(r) for r in group(final=False)) + "\n")
    out = {}
    for name, src in (("with", path), ("bare", bare)):
        run_credit_file(src, tmp_path / f"{name}.out", "graphgpo", overrides={**MEAN, "graph_final": "observed"})
        out[name] = [json.loads(x)["step_advantage"] for x in (tmp_path / f"{name}.out").read_text().splitlines()]
    assert np.allclose(np.array(out["with"])[[0, 2, 4]], centred(2.0, 0.4, 0.0))
    assert np.allclose(np.array(out["bare"])[[0, 2, 4]], centred(2.0, 0.0, 0.0))  # unknown: FAIL, as before


def test_final_state_must_be_a_string(tmp_path):
    from milegpo_cli.interchange import InterchangeError
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"group": "g", "rollout": 0, "outcome": 0, "final_state": 3, "steps": []}) + "\n")
    with pytest.raises(InterchangeError, match="final_state"):
        read_rollouts(path)


# ---------------------------------------------------------------------------------------------- HGPO

HGPO = dict(gamma=0.5, step_norm="mean_std", hgpo_history=2, hgpo_alpha=1.0)


def hgpo_pair():
    #   R0: a b c, rewards 0 0 10 (won): returns 2.5, 5, 10;   R1: a b d, rewards 0: returns 0, 0, 0
    return [Rollout("g", 0, ["a", "b", "c"], ["x", "y", "z"], [0.0, 0.0, 10.0], 1.0, True),
            Rollout("g", 1, ["a", "b", "d"], ["x", "y", "w"], [0.0, 0.0, 0.0], 0.0, False)]


def test_hgpo_weights_the_history_groups_by_length():
    a1 = 1.25 / (1.25 + EPS)  # group (a): returns 2.5, 0; mean 1.25, population std 1.25
    b1 = 2.5 / (2.5 + EPS)  # groups (b) and (a, b): returns 5, 0
    # t0: only k = 1 (weight 2); t1: k = 1 (weight 2) and k = 2 (weight 3); t2: c, d and the k = 3 keys are single
    want = [2 * a1 / (2 + EPS), 5 * b1 / (5 + EPS), 0.0]
    res = compute_advantages(RolloutBatch.from_rollouts(hgpo_pair()), "hgpo", CreditConfig(**HGPO))
    assert np.allclose(res.advantage, want + [-x for x in want], rtol=0, atol=1e-12)
    assert np.allclose(res.episode_advantage, 0.0)  # HGPO has no separate episode term


def test_hgpo_alpha_zero_weighs_every_group_alike_and_history_zero_is_the_state_alone():
    b1 = 2.5 / (2.5 + EPS)
    res = compute_advantages(RolloutBatch.from_rollouts(hgpo_pair()), "hgpo", CreditConfig(**{**HGPO, "hgpo_alpha": 0.0}))
    assert res.advantage[1] == pytest.approx(2 * b1 / (2 + EPS), abs=1e-12)
    res = compute_advantages(RolloutBatch.from_rollouts(hgpo_pair()), "hgpo", CreditConfig(**{**HGPO, "hgpo_history": 0}))
    assert res.advantage[1] == pytest.approx(2 * b1 / (2 + EPS), abs=1e-12)  # k = 1 only


def test_hgpo_leaves_zero_advantages_out_of_the_weights():
    """A group whose returns are equal gives a^k = 0: the recipe drops it from the weighted mean (so the
    base group's value is divided by its own weight 1, not by 1 + 2)."""
    same = [Rollout("g", 0, ["a", "b"], ["x", "y"], [0.0, 10.0], 1.0, True),
            Rollout("g", 1, ["a", "c"], ["x", "z"], [5.0, 0.0], 0.0, False)]  # returns at a: 5 and 5 (gamma 0.5)
    cfg = CreditConfig(**{**HGPO, "hgpo_base_group": True, "episode_stats": "steps"})
    res = compute_advantages(RolloutBatch.from_rollouts(same), "hgpo", cfg)
    rows = [1.0, 1.0, 0.0, 0.0]  # episode scores per row (outcome)
    base = (1.0 - 0.5) / (math.sqrt(sum((x - 0.5) ** 2 for x in rows) / 3) + EPS)
    assert res.advantage[0] == pytest.approx(base / (1 + EPS), abs=1e-12)


def test_hgpo_identical_looping_rollouts_give_zero_by_default_but_not_in_the_recipe():
    loop = [Rollout("g", i, ["s", "t", "s", "u"], ["a", "b", "a", "c"], [0.0, 0.0, 0.0, 10.0], 1.0) for i in range(3)]
    b = RolloutBatch.from_rollouts(loop)
    assert np.allclose(compute_advantages(b, "hgpo", CreditConfig()).advantage, 0.0)
    assert np.allclose(compute_advantages(b, "hgpo", CreditConfig(anchor_visits=True, zero_identical=False)).advantage, 0.0)
    # verl-agent: the visits of s at t = 0 and t = 2 share group (s) with different returns
    assert np.abs(compute_advantages(b, "hgpo", CreditConfig(preset="verl-agent")).advantage).max() > 0.1


def test_hgpo_an_all_equal_history_group_counts_exactly_zero():
    """Identical members B, C, D share the history (y, s) with returns 0.1, 0.1, 0.1: its group mean
    rounds to 0.1 + 1.4e-17, which normalising turned into a non-zero a^2 that diluted a^1."""
    rollouts = [Rollout("g", 0, ["x", "s"], ["p", "q"], [0.0, 1.0], 1.0, True)] + [
        Rollout("g", i, ["y", "s"], ["p", "q"], [0.0, 0.1], 0.1, False) for i in (1, 2, 3)]
    cfg = CreditConfig(**{**HGPO, "anchor_visits": False, "zero_identical": False})
    res = compute_advantages(RolloutBatch.from_rollouts(rollouts), "hgpo", cfg)
    returns = np.array([1.0, 0.1, 0.1, 0.1])  # of the four steps at s (level 1)
    a1 = (returns - returns.mean()) / (returns.std() + EPS)
    at_s = res.advantage[1::2]
    assert at_s[1:] == pytest.approx([a1[1] * 2 / (2 + EPS)] * 3, abs=1e-12)  # level 2 left out, not 0.4 x a^1


@pytest.mark.parametrize("algo", ["grpo", "gigpo", "graphgpo", "milegpo", "hgpo"])
@pytest.mark.parametrize("norm", ["mean_std", "mean"])
def test_a_group_of_equal_returns_gets_exactly_zero(algo, norm):
    """Three different rollouts of outcome 0.1 and equal rewards: every normalised group is all-equal."""
    rollouts = [Rollout("g", i, [f"s{i}", f"t{i}"], ["p", f"q{i}"], [0.0, 0.1], 0.1, False) for i in range(3)]
    cfg = CreditConfig(episode_norm=norm, step_norm=norm, zero_identical=False, anchor_visits=False)
    res = compute_advantages(RolloutBatch.from_rollouts(rollouts), algo, cfg)
    assert np.all(res.advantage == 0.0) and np.all(res.episode_advantage == 0.0)
