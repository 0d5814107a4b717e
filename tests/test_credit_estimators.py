"""Hand-computed small groups for every estimator (exact numbers)."""
import dataclasses

import numpy as np
import pytest

from milegpo_cli.credit import CreditConfig, Rollout, RolloutBatch, compute_advantages

EPS = CreditConfig(eps=1e-12, lambda_p=0.5)
# v2 (docs/algorithms.md) hand-computed with lambdas 0.5 and gates closed; its credit is centred per anchor group
V2 = CreditConfig(formulation="v2", eps=1e-12, lambda_p=0.5, lambda_m=0.5, lambda_t=0.5, g_p=0.0, g_b=0.0)


def centred(b, raw):
    """The v2 credit of ``raw`` (uncentred) after centring (gigpo.centre)."""
    from milegpo_cli.credit.anchors import config_anchors
    from milegpo_cli.credit.gigpo import centre
    return centre(np.asarray(raw, float), *config_anchors(b, V2), b.step_group, b.num_groups)


def batch(*rollouts):
    return RolloutBatch.from_rollouts([Rollout(*r) for r in rollouts])


def two_rollouts():
    # r0: A -> B -> SUCCESS, rewards [0, 10]; r1: A -> C -> FAIL
    return batch(("g", 0, ["A", "B"], ["a", "b"], [0, 10], 1.0), ("g", 1, ["A", "C"], ["x", "y"], [0, 0], 0.0))


def test_grpo_mean_std_and_mean():
    b = batch(*[("g", i, ["s"], ["a"], [0], o) for i, o in enumerate([1.0, 0.0, 0.0, 1.0])])
    res = compute_advantages(b, "grpo", EPS)
    z = 0.5 / np.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1] is sqrt(1/3)
    assert np.allclose(res.advantage, [z, -z, -z, z], rtol=1e-9)
    assert np.array_equal(res.step_advantage, np.zeros(4))
    res = compute_advantages(b, "grpo", CreditConfig(episode_norm="mean"))
    assert np.allclose(res.advantage, [0.5, -0.5, -0.5, 0.5])
    res = compute_advantages(b, "grpo", CreditConfig(std_unbiased=False, eps=1e-12))
    assert np.allclose(res.advantage, [1, -1, -1, 1])


def test_grpo_single_rollout_follows_verl_agent():
    # verl-agent: a one-rollout group has mean 0 and std 1 (zero_identical off, as in the preset)
    res = compute_advantages(batch(("g", 0, ["s", "t"], ["a", "b"], [0, 0], 0.7)), "grpo",
                             dataclasses.replace(EPS, zero_identical=False))
    assert np.allclose(res.advantage, [0.7, 0.7])
    # by default a group of one rollout compares nothing: 0, so no outcome reaches A unnormalised
    res = compute_advantages(batch(("g", 0, ["s", "t"], ["a", "b"], [0, 0], 5000.0)), "grpo", EPS)
    assert np.allclose(res.advantage, [0.0, 0.0])


def test_gigpo_hand_computed():
    cfg = CreditConfig(eps=1e-12, gamma=0.5)
    res = compute_advantages(two_rollouts(), "gigpo", cfg)
    # returns r0 [5, 10], r1 [0, 0]; anchor A = {5, 0} -> +-1/sqrt(2); B, C singletons -> 0
    h = 1 / np.sqrt(2)
    assert np.allclose(res.episode_advantage, [h, h, -h, -h])
    assert np.allclose(res.step_advantage, [h, 0, -h, 0])
    assert np.allclose(res.advantage, [2 * h, h, -2 * h, -h])
    mean = compute_advantages(two_rollouts(), "gigpo", CreditConfig(gamma=0.5, episode_norm="mean", step_norm="mean"))
    assert np.allclose(mean.advantage, [3.0, 0.5, -3.0, -0.5])
    half = compute_advantages(two_rollouts(), "gigpo", CreditConfig(eps=1e-12, gamma=0.5, omega=0.5))
    assert np.allclose(half.advantage, [1.5 * h, h, -1.5 * h, -h])


def test_gigpo_discounted_returns_over_ragged_rollouts():
    b = batch(("g", 0, ["A", "B", "C"], ["a"] * 3, [1, 2, 4], 1.0), ("g", 1, ["A"], ["a"], [3], 0.0))
    from milegpo_cli.credit.gigpo import discounted_returns
    g = discounted_returns(b.reward, b.offset, b.length, 0.5)
    assert g.tolist() == [1 + 0.5 * 2 + 0.25 * 4, 2 + 0.5 * 4, 4.0, 3.0]


def test_episode_stats_over_step_rows_like_verl_agent():
    b = batch(("g", 0, ["A"], ["a"], [10], 1.0), ("g", 1, ["A", "C", "D"], ["x"] * 3, [0] * 3, 0.0))
    rows = compute_advantages(b, "grpo", CreditConfig(eps=1e-12, episode_stats="steps"))
    # rows [1, 0, 0, 0]: mean 0.25, unbiased std 0.5
    assert np.allclose(rows.rollout_advantage, [1.5, -0.5])
    per_rollout = compute_advantages(b, "grpo", CreditConfig(eps=1e-12))
    assert np.allclose(per_rollout.rollout_advantage, [1 / np.sqrt(2), -1 / np.sqrt(2)])


def test_graphgpo_distance_decayed_credit():
    # r0: A -a-> B -b-> SUCCESS; r1: A -x-> C -y-> FAIL; r2: A -a-> B -z-> FAIL
    b = batch(("g", 0, ["A", "B"], ["a", "b"], [0, 10], 1.0), ("g", 1, ["A", "C"], ["x", "y"], [0, 0], 0.0),
              ("g", 2, ["A", "B"], ["a", "z"], [0, 0], 0.0))
    from milegpo_cli.credit.graph import build_graph
    from milegpo_cli.credit.graphgpo import graph_return
    graph = build_graph(b)
    assert graph.distance[b.step_state[:2]].tolist() == [2, 1] and np.isinf(graph.distance[b.step_state[3]])
    # d(next): r0 [1, 0], r1 [inf, fail], r2 [1, fail] -> 10 * 0.2 ** d
    assert np.allclose(graph_return(graph, 10.0, 0.2), [2, 10, 0, 0, 2, 0])
    res = compute_advantages(b, "graphgpo", EPS)
    s = np.sqrt(4 / 3)  # anchor A: {2, 0, 2}, mean 4/3, unbiased std sqrt(4/3)
    h = 1 / np.sqrt(2)  # anchor B: {10, 0}
    assert np.allclose(res.step_advantage, [(2 / 3) / s, h, -(4 / 3) / s, 0, (2 / 3) / s, -h])
    e = np.sqrt(1 / 3)  # outcomes [1, 0, 0]
    assert np.allclose(res.episode_advantage, np.repeat([(2 / 3) / e, -(1 / 3) / e, -(1 / 3) / e], 2))
    mean = compute_advantages(b, "graphgpo", CreditConfig(step_norm="mean", episode_norm="mean"))
    assert np.allclose(mean.step_advantage, [2 / 3, 5, -4 / 3, 0, 2 / 3, -5])


def four_rollouts():
    return batch(("g", "0", ["s0", "s1", "s2"], ["a", "b", "c"], [0, 0, 10], 1.0),
                 ("g", "1", ["s0", "s3", "s3"], ["x", "y", "y"], [0, 0, 0], 0.0),
                 ("g", "2", ["s0", "s1", "s4"], ["a", "b", "d"], [0, 0, 0], 0.0),
                 ("g", "3", ["s0", "s1", "s2"], ["a", "b", "c"], [0, 0, 10], 1.0))


def test_milegpo_hand_computed():
    b = four_rollouts()
    res = compute_advantages(b, "milegpo", V2)
    # p̄ = 1/2, k = 2. s1: n+ 2, n- 1 -> Beta(3, 2): rho = 1 - 2 * 5/16 = 3/8
    # s2: n+ 2, n- 0 -> Beta(3, 1): rho = 1 - 2 * 1/8 = 3/4; s3 (loop in a failure): Beta(1, 2): rho = 1 - 2 * 3/4
    cands = {c.key: c for c in res.candidates}
    assert set(cands) == {"s1", "s2", "s3"}
    assert cands["s1"].kind == "milestone" and cands["s1"].rho == pytest.approx(3 / 8)
    assert cands["s2"].kind == "milestone" and cands["s2"].rho == pytest.approx(3 / 4)
    assert cands["s3"].kind == "trap" and cands["s3"].rho == pytest.approx(-1 / 2)
    assert (cands["s1"].n_pos, cands["s1"].n_neg, cands["s1"].distance) == (2, 1, 2.0)
    assert np.isinf(cands["s3"].distance) and np.isnan(cands["s2"].branch_ok)  # s1 shows one action only
    # dense progress +-0.5; entries: s0 -a-> s1: 0.5 * 3/8 (progress ok, Q(s0,a) = 2/3 > V = 1/2);
    # s1 -> s2: 0.5 * 3/4 (unverified); s0 -x-> s3: 0.5 * -1/2 (no progress, Q = 0 < V)
    expected = [0.5 + 3 / 16, 0.5 + 3 / 8, 0.5, -0.5 - 1 / 4, -0.5, -0.5,
                0.5 + 3 / 16, -0.5, -0.5, 0.5 + 3 / 16, 0.5 + 3 / 8, 0.5]
    assert np.allclose(res.credit, centred(b, expected))
    gig = compute_advantages(b, "gigpo", EPS)
    assert np.allclose(res.step_advantage, gig.step_advantage + centred(b, expected))
    assert np.allclose(res.advantage, gig.episode_advantage + gig.step_advantage + centred(b, expected))
    assert res.milestone.tolist() == [True, True, False, False, False, False, True, False, False, True, True, False]
    assert np.flatnonzero(res.trap).tolist() == [3]
    assert np.flatnonzero(res.unverified).tolist() == [1, 10]
    assert res.progress.tolist() == [1, 1, 1, -1, -1, -1, 1, -1, -1, 1, 1, 1]
    assert res.branch.tolist() == [1, 0, 0, -1, 0, 0, 1, 0, 0, 1, 0, 0]


def test_milegpo_reliability_drop_uses_unit_rho():
    res = compute_advantages(four_rollouts(), "milegpo", V2, drop={"reliability"})
    assert sorted(c.rho for c in res.candidates) == [-1.0, 1.0, 1.0]
    assert res.candidates[0].credit == pytest.approx(0.5)  # s1 entered with progress: lambda_m * 1


def gated():
    # p̄ = 3/4; s1 (n+ 2, n- 0) is a milestone entered from s0 without progress: d(s0) = d(s1) = 2
    return batch(("g", 0, ["s0", "s1", "s2"], ["a", "b", "c"], [0, 0, 1], 1.0),
                 ("g", 1, ["s0", "s1", "s2"], ["a", "b", "c"], [0, 0, 1], 1.0),
                 ("g", 2, ["s0", "s2"], ["d", "c"], [0, 1], 1.0),
                 ("g", 3, ["s0", "s3"], ["e", "f"], [0, 0], 0.0))


def test_progress_gate_scales_unconfirmed_milestones():
    from milegpo_cli.credit.milegpo import reliability
    rho = float(reliability(np.array([2]), np.array([0]), np.array([0.75]), 2.0)[0])
    assert rho > 0
    closed = compute_advantages(gated(), "milegpo", CreditConfig(formulation="v2", g_p=0.0, lambda_p=0.5))
    open_ = compute_advantages(gated(), "milegpo", CreditConfig(formulation="v2", g_p=1.0, lambda_p=0.5))
    no_progress = compute_advantages(gated(), "milegpo", V2, drop={"progress"})
    rho_s2 = float(reliability(np.array([3]), np.array([0]), np.array([0.75]), 2.0)[0])
    credit = {(name, c.key): c.credit for name, r in (("closed", closed), ("open", open_), ("none", no_progress))
              for c in r.candidates}
    assert credit["open", "s1"] == pytest.approx(0.5 * rho)  # the gate is open: kept without progress
    assert credit["none", "s1"] == pytest.approx(0.5 * rho) and credit["none", "s2"] == pytest.approx(0.5 * rho_s2)
    s1 = [c for c in closed.candidates if c.key == "s1"][0]
    assert s1.progress_ok == 0.0 and s1.credit == 0.0


def test_branch_gate_scales_contradicted_candidates():
    b = batch(("g", 0, ["s0", "s1", "s2"], ["a", "b", "c"], [0, 0, 1], 1.0),
              ("g", 1, ["s0", "s1", "s2"], ["a", "b", "c"], [0, 0, 1], 1.0),
              ("g", 2, ["s0", "s1"], ["a", "q"], [0, 0], 0.0),
              ("g", 3, ["s0", "s1"], ["a", "q"], [0, 0], 0.0),
              ("g", 4, ["s0", "s5"], ["d", "e"], [0, 1], 1.0))
    # s2 (n+ 2, n- 0) is a milestone; its entry s1 -b-> s2 has Q(s1, b) = 1 > V(s1) = 1/2: kept.
    # s1 (n+ 2, n- 2, p = 1/2 < p̄ = 3/5) is no milestone.
    res = compute_advantages(b, "milegpo", V2)
    s2 = [c for c in res.candidates if c.key == "s2"][0]
    assert s2.kind == "milestone" and s2.branch_ok == 1.0
    assert [c for c in res.candidates if c.key == "s5"] == []  # n+ = 1 < min(m_min, N+) = 2
    dropped = compute_advantages(b, "milegpo", V2, drop={"branch"})
    assert np.isnan([c for c in dropped.candidates if c.key == "s2"][0].branch_ok)


def test_branch_gate_removes_credit_when_evidence_disagrees():
    # (s0, a) leads to m twice (both succeed) and to t three times (all fail): Q(s0, a) = 2/5 < V(s0) = 4/7.
    # m is a milestone (n+ 2, n- 0, p = 1 > p̄ = 4/7) whose entry the same-state evidence contradicts;
    # z (entered by b, Q(s0, b) = 1) is one it supports.
    rows = [("g", 0, ["s0", "m"], ["a", "c"], [0, 1], 1.0), ("g", 1, ["s0", "m"], ["a", "c"], [0, 1], 1.0)]
    rows += [("g", 2 + i, ["s0", "t"], ["a", "y"], [0, 0], 0.0) for i in range(3)]
    rows += [("g", 5 + i, ["s0", "z"], ["b", "c"], [0, 1], 1.0) for i in range(2)]
    b = batch(*rows)
    from milegpo_cli.credit.milegpo import reliability
    rho = float(reliability(np.array([2]), np.array([0]), np.array([4 / 7]), 2.0)[0])
    res = compute_advantages(b, "milegpo", V2)
    cands = {c.key: c for c in res.candidates}
    assert cands["m"].kind == "milestone" and cands["m"].branch_ok == 0.0 and cands["m"].credit == 0.0
    assert cands["z"].branch_ok == 1.0 and cands["z"].credit == pytest.approx(0.5 * rho)
    assert res.branch[0] == -1 and res.branch[10] == 1
    half = compute_advantages(b, "milegpo", CreditConfig(formulation="v2", g_b=0.5, lambda_p=0.5))
    assert [c.credit for c in half.candidates if c.key == "m"] == [pytest.approx(0.25 * rho)]
    dropped = compute_advantages(b, "milegpo", CreditConfig(formulation="v2", lambda_p=0.5), drop={"branch"})
    assert [c.credit for c in dropped.candidates if c.key == "m"] == [pytest.approx(0.5 * rho)]
    assert not dropped.unverified.any()
