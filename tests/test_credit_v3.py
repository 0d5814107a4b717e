"""MileGPO v3 (docs/algorithms.md): centring, credit without a success, verl-agent preset, anchors, numerics."""
import difflib

import numpy as np
import pytest

from milegpo_cli.credit import ALGORITHMS, CreditConfig, Rollout, RolloutBatch, compute_advantages
from milegpo_cli.credit.anchors import cluster_keys, step_anchors
from milegpo_cli.credit.batch import CreditError
from milegpo_cli.errors import MilegpoError

FORMULATIONS = ("v3", "v2", "ours", "paper")
IDENTICAL = {
    "plain": ["s", "t"], "loop": ["s", "t", "t", "u"], "long loop": ["s", "t", "s", "t", "u"],
}


@pytest.mark.parametrize("algo", ALGORITHMS)
@pytest.mark.parametrize("formulation", FORMULATIONS)
@pytest.mark.parametrize("case", sorted(IDENTICAL))
@pytest.mark.parametrize("outcome", [0.0, 1.0])
def test_identical_rollouts_give_zero(algo, formulation, case, outcome):
    states = IDENTICAL[case]
    rewards = [0.0] * (len(states) - 1) + [10.0 * outcome]
    rollouts = [Rollout("g", i, states, [f"a{t}" for t in range(len(states))], rewards, outcome) for i in range(4)]
    for cfg in (CreditConfig(formulation=formulation), CreditConfig(formulation=formulation, step_norm="mean",
                                                                     episode_norm="mean", episode_stats="steps")):
        res = compute_advantages(RolloutBatch.from_rollouts(rollouts), algo, cfg)
        assert np.allclose(res.advantage, 0.0, atol=1e-9), res.advantage


def test_identical_groups_stay_zero_next_to_informative_ones():
    same = [Rollout("g", i, ["s", "t"], ["a", "b"], [0, 10], 1.0) for i in range(3)]
    mixed = [Rollout("h", 0, ["s", "t"], ["a", "b"], [0, 10], 1.0), Rollout("h", 1, ["s", "u"], ["c", "d"], [0, 0], 0.0)]
    b = RolloutBatch.from_rollouts(same + mixed)
    res = compute_advantages(b, "milegpo", CreditConfig())
    assert np.allclose(res.advantage[:6], 0.0) and np.abs(res.advantage[6:]).max() > 0.1


def loops_without_success():
    """An all-fail group: r0 and r1 circle between s0 and s1 ('look' leaves s0 and comes back), r2 and r3
    move on; nothing succeeds."""
    return RolloutBatch.from_rollouts([
        Rollout("g", 0, ["s0", "s1", "s0", "s1", "s0"], ["go", "back", "go", "back", "go"], [0] * 5, 0.0),
        Rollout("g", 1, ["s0", "s1", "s0", "s2"], ["go", "back", "on", "x"], [0] * 4, 0.0),
        Rollout("g", 2, ["s0", "s2", "s3"], ["on", "x", "y"], [0] * 3, 0.0),
        Rollout("g", 3, ["s0", "s2", "s3"], ["on", "x", "y"], [0] * 3, 0.0),
    ])


def test_traps_give_credit_in_a_group_without_success():
    b = loops_without_success()
    for algo in ("grpo", "gigpo", "graphgpo"):
        assert np.allclose(compute_advantages(b, algo, CreditConfig()).advantage, 0.0)
    res = compute_advantages(b, "milegpo", CreditConfig())
    first = b.offset  # step 0 of each rollout: "go" (into the loop) vs "on"
    assert res.advantage[first[0]] < 0 and res.advantage[first[1]] < 0
    assert res.advantage[first[2]] > 0 and res.advantage[first[3]] > 0
    assert abs(res.advantage.mean()) < 0.5 and {c.kind for c in res.candidates} == {"trap"}
    assert np.allclose(compute_advantages(b, "milegpo", CreditConfig(), drop={"traps"}).advantage, 0.0)


def test_gates_scale_rather_than_cancel():
    # a trap left by a transition that the graph calls progress still gets g_p of its credit
    b = RolloutBatch.from_rollouts([
        Rollout("g", 0, ["s0", "t", "s0", "t", "w"], ["a", "b", "a", "c", "d"], [0, 0, 0, 0, 10], 1.0),
        Rollout("g", 1, ["s0", "t", "s0", "t"], ["a", "b", "a", "b"], [0, 0, 0, 0], 0.0),
        Rollout("g", 2, ["s0", "t", "s0", "x"], ["a", "b", "e", "f"], [0, 0, 0, 0], 0.0),
    ])
    credit = {g: {c.key: c.credit for c in compute_advantages(b, "milegpo", CreditConfig(g_p=g, g_b=g)).candidates
                  if c.kind == "trap"} for g in (0.0, 0.5, 1.0)}
    assert credit[1.0]["s0"] < credit[0.5]["s0"] < credit[0.0]["s0"] <= 0
    assert credit[0.5]["s0"] < 0  # not cancelled


def test_same_state_tie_is_neutral():
    # at s0 both actions have the same mean outcome (Q = V): a tie must not scale the milestone credit
    rows = [Rollout("g", 0, ["s0", "m", "z"], ["a", "b", "c"], [0, 0, 1], 1.0),
            Rollout("g", 1, ["s0", "m", "z"], ["a", "b", "c"], [0, 0, 1], 1.0),
            Rollout("g", 2, ["s0", "m"], ["a", "q"], [0, 0], 0.0),
            Rollout("g", 3, ["s0", "n", "z"], ["e", "c", "c"], [0, 0, 1], 1.0),
            Rollout("g", 4, ["s0", "n", "z"], ["e", "c", "c"], [0, 0, 1], 1.0),
            Rollout("g", 5, ["s0", "n"], ["e", "q"], [0, 0], 0.0)]
    b = RolloutBatch.from_rollouts(rows)
    open_ = {c.key: c.credit for c in compute_advantages(b, "milegpo", CreditConfig(g_b=1.0)).candidates}
    closed = {c.key: c.credit for c in compute_advantages(b, "milegpo", CreditConfig(g_b=0.0)).candidates}
    assert closed["m"] == pytest.approx(open_["m"]) and open_["m"] != 0


def test_reliability_weights_by_support():
    def group(n):  # n successes through m, n failures elsewhere
        rows = [Rollout("g", f"p{i}", ["s0", "m"], ["a", "b"], [0, 1], 1.0) for i in range(n)]
        rows += [Rollout("g", f"n{i}", ["s0", f"f{i}"], ["c", "d"], [0, 0], 0.0) for i in range(n)]
        return {c.key: c for c in compute_advantages(RolloutBatch.from_rollouts(rows), "milegpo", CreditConfig()).candidates}
    assert 0 < group(2)["m"].rho < group(10)["m"].rho <= 1


def test_verl_agent_preset_fixes_its_conventions():
    cfg = CreditConfig(preset="verl-agent", episode_norm="mean", episode_stats="rollouts")
    assert (cfg.episode_stats, cfg.step_norm, cfg.episode_score, cfg.episode_scale, cfg.invalid_penalty,
            cfg.anchor_visits) == ("steps", "mean", "success", 10.0, 0.1, False)
    with pytest.raises(ValueError, match="^preset:"):
        CreditConfig(preset="nope")


def reference_gigpo(rollouts, mode, thresh=None, gamma=0.95, penalty=0.1, eps=1e-6):
    """verl-agent's compute_gigpo_outcome_advantage on step rows, written out from its description
    (docs/algorithms.md, preset `verl-agent`): row score 10 x success - penalty x invalid, statistics
    over rows; step group = exact anchor match (or greedy SequenceMatcher clustering) within the uid;
    returns minus the penalty."""
    rows = []
    for r in rollouts:
        g, T = 0.0, len(r.states)
        rets = [0.0] * T
        for t in reversed(range(T)):
            g = r.rewards[t] + gamma * g
            rets[t] = g
        for t in range(T):
            inv = bool(r.invalid[t]) if r.invalid else False
            rows.append((r.group, r.states[t], 10.0 * bool(r.success) - penalty * inv, rets[t] - penalty * inv))

    def norm(values, keys):
        out = np.zeros(len(values))
        for k in set(keys):
            idx = [i for i, kk in enumerate(keys) if kk == k]
            v = np.array([values[i] for i in idx])
            if len(idx) == 1 and keys is ep_keys:
                mean, std = 0.0, 1.0
            else:
                mean, std = v.mean(), (v.std(ddof=1) if len(idx) > 1 else 1.0)
            out[idx] = v - mean if mode == "mean" else (v - mean) / (std + eps)
        return out

    ep_keys = [r[0] for r in rows]
    step_keys = []
    clusters = {}
    for grp, obs, _, _ in rows:
        reps = clusters.setdefault(grp, [])
        if thresh is None:
            step_keys.append((grp, obs))
            continue
        for j, rep in enumerate(reps):
            if difflib.SequenceMatcher(None, obs, rep).ratio() >= thresh:
                step_keys.append((grp, j))
                break
        else:
            reps.append(obs)
            step_keys.append((grp, len(reps) - 1))
    return norm([r[2] for r in rows], ep_keys) + norm([r[3] for r in rows], step_keys)


def verl_rollouts():
    words = ["you are in the kitchen", "you are in the kitchen.", "you see a fridge", "you see a fridge 1",
             "on the counter you see an apple", "the drawer is open"]
    rng = np.random.default_rng(3)
    out = []
    for g in range(3):
        for i in range(4):
            T = int(rng.integers(2, 6))
            states = [words[int(k)] for k in rng.integers(0, len(words), T)]
            won = bool(rng.random() < 0.5)
            out.append(Rollout(f"g{g}", i, states, [f"a{int(k)}" for k in rng.integers(0, 3, T)],
                               [0.0] * (T - 1) + [10.0 * won], 0.7 + 0.3 * won, success=won,
                               invalid=[bool(x) for x in rng.random(T) < 0.3]))
    return out


@pytest.mark.parametrize("mode", ["mean", "mean_std"])
@pytest.mark.parametrize("thresh", [None, 0.9])
def test_verl_agent_preset_reproduces_its_gigpo(mode, thresh):
    rollouts = verl_rollouts()
    cfg = CreditConfig(preset="verl-agent", episode_norm=mode, similarity_thresh=thresh or 1.0)
    res = compute_advantages(RolloutBatch.from_rollouts(rollouts), "gigpo", cfg)
    assert np.allclose(res.advantage, reference_gigpo(rollouts, mode, thresh), atol=1e-9)


def test_similarity_clustering_matches_greedy_reference_and_scales():
    rng = np.random.default_rng(0)
    base = ["you are in the middle of a room. looking around you see a cabinet %d" % i for i in range(30)]
    keys = list(dict.fromkeys(base[int(i)] + ("" if rng.random() < 0.5 else " and a drawer") for i in rng.integers(0, 30, 200)))
    reps, expected = [], []
    for k in keys:
        for j, r in enumerate(reps):
            if difflib.SequenceMatcher(None, k, r).ratio() >= 0.95:
                expected.append(j)
                break
        else:
            reps.append(k)
            expected.append(len(reps) - 1)
    assert cluster_keys(keys, 0.95).tolist() == expected
    b = RolloutBatch.from_rollouts([Rollout("g", i, keys[i::5], ["a"] * len(keys[i::5]), [0.0] * len(keys[i::5]), 0.0)
                                    for i in range(5)])
    anchor, count = step_anchors(b, 0.95)
    assert count == len(reps) and anchor.size == b.num_steps


@pytest.mark.parametrize("big", [1.7e308, -1.7e308, 1e101])
def test_huge_outcomes_are_rejected_in_one_line(big):
    with pytest.raises(MilegpoError, match=r"^outcome: .*rescale") as err:
        RolloutBatch.from_rollouts([Rollout("g", 0, ["s"], ["a"], [0.0], big), Rollout("g", 1, ["s"], ["a"], [0.0], 0.0)])
    assert "\n" not in str(err.value) and isinstance(err.value, CreditError)
    with pytest.raises(MilegpoError, match="^rewards:"):
        RolloutBatch.from_rollouts([Rollout("g", 0, ["s"], ["a"], [big], 0.0)])


def test_large_but_accepted_values_stay_finite():
    rollouts = [Rollout("g", 0, ["s", "t"], ["a", "b"], [0.0, 1e100], 1e100),
                Rollout("g", 1, ["s", "u"], ["c", "d"], [0.0, -1e100], -1e100)]
    b = RolloutBatch.from_rollouts(rollouts)
    for algo in ALGORITHMS:
        for f in ("v3", "v2", "paper"):
            res = compute_advantages(b, algo, CreditConfig(formulation=f, episode_scale=1e6))
            assert np.isfinite(res.advantage).all()


def test_oracle_milestones_reference():
    def rollouts(same):
        out = []
        for i in range(3):
            good = same or i == 0
            out.append(Rollout("g", i, ["s0", "s1" if good else "x"], ["a" if good else "b", "c"], [0.0, 0.0], 0.0,
                               subgoals=[["take apple"] if good else [], []]))
        return RolloutBatch.from_rollouts(out)
    res = compute_advantages(rollouts(False), "oracle-milestones", CreditConfig())
    assert res.advantage[0] > 0 > res.advantage[2] and res.milestone[0] and not res.milestone[2]
    assert np.allclose(compute_advantages(rollouts(True), "oracle-milestones", CreditConfig()).advantage, 0.0)
    with pytest.raises(CreditError, match="^subgoals:"):
        compute_advantages(RolloutBatch.from_rollouts([Rollout("g", 0, ["s"], ["a"], [0.0], 0.0)]),
                           "oracle-milestones", CreditConfig())
