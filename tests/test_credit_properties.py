"""Property tests (hypothesis) and the ablation identities of issue 3."""
import networkx as nx
import numpy as np
from hypothesis import given, settings, strategies as st

from milegpo_cli.credit import ALGORITHMS, CreditConfig, Rollout, RolloutBatch, compute_advantages
from milegpo_cli.credit.milegpo import reliability

SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def rollout_lists(draw, max_groups=3, max_rollouts=6, max_len=6):
    out = []
    for g in range(draw(st.integers(1, max_groups))):
        n_states = draw(st.integers(1, 5))
        for i in range(draw(st.integers(1, max_rollouts))):
            length = draw(st.integers(0, max_len))
            states = ["s0"] + [f"s{draw(st.integers(0, n_states))}" for _ in range(length - 1)] if length else []
            actions = [draw(st.sampled_from("abc")) for _ in range(length)]
            rewards = [draw(st.sampled_from([0.0, 1.0, 10.0])) for _ in range(length)]
            out.append(Rollout(f"g{g}", i, states, actions, rewards, draw(st.sampled_from([0.0, 0.5, 1.0]))))
    return out


CONFIGS = [CreditConfig(), CreditConfig(formulation="paper"), CreditConfig(episode_norm="mean", step_norm="mean"),
           CreditConfig(episode_stats="steps")]


@SETTINGS
@given(rollout_lists())
def test_advantages_finite_for_every_estimator(rollouts):
    b = RolloutBatch.from_rollouts(rollouts)
    for algo in ALGORITHMS:
        for cfg in CONFIGS:
            res = compute_advantages(b, algo, cfg)
            for arr in (res.advantage, res.episode_advantage, res.step_advantage, res.credit):
                assert arr.shape == (b.num_steps,) and np.isfinite(arr).all()


@SETTINGS
@given(rollout_lists())
def test_grpo_advantages_sum_to_zero_per_group(rollouts):
    b = RolloutBatch.from_rollouts(rollouts)
    adv = compute_advantages(b, "grpo", CreditConfig()).rollout_advantage
    sums = np.bincount(b.rollout_group, weights=adv, minlength=b.num_groups)
    sizes = np.bincount(b.rollout_group, minlength=b.num_groups)
    assert np.allclose(sums[sizes > 1], 0.0, atol=1e-6)


@SETTINGS
@given(rollout_lists(), st.randoms(use_true_random=False))
def test_permuting_rollouts_permutes_outputs(rollouts, rnd):
    perm = list(rollouts)
    rnd.shuffle(perm)
    a, b = RolloutBatch.from_rollouts(rollouts), RolloutBatch.from_rollouts(perm)

    def keyed(batch, res):
        return {(batch.group_names[batch.step_group[i]], batch.rollout_ids[batch.step_rollout[i]], int(batch.step_t[i])):
                (res.advantage[i], res.credit[i], res.milestone[i], res.trap[i]) for i in range(batch.num_steps)}

    for algo in ALGORITHMS:
        for cfg in CONFIGS[:2]:
            ka, kb = keyed(a, compute_advantages(a, algo, cfg)), keyed(b, compute_advantages(b, algo, cfg))
            assert ka.keys() == kb.keys()
            for k in ka:
                assert np.allclose(ka[k][:2], kb[k][:2], atol=1e-9) and ka[k][2:] == kb[k][2:]


@SETTINGS
@given(st.integers(1, 30), st.floats(0.5, 8.0))
def test_equal_success_and_failure_visits_give_rho_zero(m, k):
    assert abs(reliability(np.array([m]), np.array([m]), np.array([0.5]), k)[0]) < 1e-9


@SETTINGS
@given(st.integers(1, 6), st.integers(1, 6))
def test_state_visited_equally_by_successes_and_failures_is_no_candidate(n_pos, n_neg):
    rollouts = [Rollout("g", f"p{i}", ["s0", "both", f"p{i % 2}"], ["a", "b", "c"], [0, 0, 1], 1.0) for i in range(n_pos)]
    rollouts += [Rollout("g", f"n{i}", ["s0", "both", f"n{i % 2}"], ["a", "b", "d"], [0, 0, 0], 0.0) for i in range(n_neg)]
    b = RolloutBatch.from_rollouts(rollouts)
    res = compute_advantages(b, "milegpo", CreditConfig(formulation="v2"))
    assert "both" not in {c.key for c in res.candidates}
    # v3 selects by support, but every rollout enters "both" from the same first visit of s0: centred to 0
    v3 = compute_advantages(b, "milegpo", CreditConfig())
    assert np.allclose(v3.credit[b.step_t == 0], 0.0, atol=1e-12)


@SETTINGS
@given(rollout_lists(max_groups=1))
def test_decoy_visited_by_every_rollout_is_never_a_milestone(rollouts):
    with_decoy = [Rollout(r.group, r.rollout_id, list(r.states[:1]) + ["DECOY"] + list(r.states[1:]),
                          list(r.actions[:1]) + ["wait"] + list(r.actions[1:]),
                          list(r.rewards[:1]) + [0.0] + list(r.rewards[1:]), r.outcome)
                  for r in rollouts if r.states]
    if not with_decoy:
        return
    b = RolloutBatch.from_rollouts(with_decoy)
    for cfg in (CreditConfig(formulation="v2"), CreditConfig(formulation="paper"), CreditConfig(formulation="v2", m_min=1)):
        res = compute_advantages(b, "milegpo", cfg)
        assert "DECOY" not in {c.key for c in res.candidates if c.kind == "milestone"}
    for cfg in (CreditConfig(), CreditConfig(m_min=1)):  # v3: a candidate by support, with little outcome weight
        res = compute_advantages(b, "milegpo", cfg)
        assert all(abs(c.rho) < 0.3 for c in res.candidates if c.kind == "milestone" and c.key == "DECOY")


def reference_distances(b):
    """Fewest steps to SUCCESS per (group, state key), with networkx."""
    g = nx.DiGraph()
    for i in range(b.num_steps):
        u = ("s", int(b.step_state[i]))
        last = b.step_last[i]
        v = ("SUCCESS",) if last and b.step_success[i] else ("FAIL",) if last else ("s", int(b.step_state[i + 1]))
        g.add_edge(u, v)
    if ("SUCCESS",) not in g:
        return lambda node: np.inf
    d = nx.single_target_shortest_path_length(g, ("SUCCESS",))
    table = dict(d)
    return lambda node: table.get(node, np.inf)


@SETTINGS
@given(rollout_lists())
def test_progress_signal_follows_graph_distance(rollouts):
    b = RolloutBatch.from_rollouts(rollouts)
    # zero_identical off: the credit of a group of one rollout (or of identical ones) is kept, not zeroed
    v3 = compute_advantages(b, "milegpo", CreditConfig(zero_identical=False), drop={"milestones", "traps"})
    v2 = compute_advantages(b, "milegpo", CreditConfig(formulation="v2", zero_identical=False),
                            drop={"milestones", "traps"})
    dist = reference_distances(b)
    has_success = np.bincount(b.rollout_group[b.success], minlength=b.num_groups) > 0
    for i in range(b.num_steps):
        last = b.step_last[i]
        v = ("SUCCESS",) if last and b.step_success[i] else ("FAIL",) if last else ("s", int(b.step_state[i + 1]))
        du = dist(("s", int(b.step_state[i])))
        shorter = dist(v) < du
        assert v2.progress[i] == (0 if not has_success[b.step_group[i]] else 1 if shorter else -1)
        assert v3.progress[i] == (0 if np.isinf(du) else 1 if shorter else -1)  # silent where u cannot reach SUCCESS
    for res in (v2, v3):  # the dense credit is the centred progress signal
        assert np.allclose(res.credit, centred(b, CreditConfig().lambda_p * res.progress))


def centred(b, x):
    from milegpo_cli.credit.anchors import config_anchors
    from milegpo_cli.credit.gigpo import centre
    return centre(np.asarray(x, float), *config_anchors(b, CreditConfig()), b.step_group, b.num_groups)


@SETTINGS
@given(rollout_lists(), st.sampled_from(CONFIGS[:3]))
def test_dropping_milestones_traps_progress_is_gigpo_exactly(rollouts, cfg):
    b = RolloutBatch.from_rollouts(rollouts)
    gig = compute_advantages(b, "gigpo", cfg)
    for form in ("v3", "ours"):  # "ours": the old name of v2
        mile = compute_advantages(b, "milegpo", CreditConfig(**{**cfg.__dict__, "formulation": form}),
                                  drop={"milestones", "traps", "progress"})
        assert np.array_equal(mile.advantage, gig.advantage)
        assert np.array_equal(mile.step_advantage, gig.step_advantage)
        assert not mile.credit.any() and mile.candidates == []


def test_dropping_milestones_and_traps_leaves_dense_progress_credit():
    b = RolloutBatch.from_rollouts([Rollout("g", 0, ["s0", "s1"], ["a", "b"], [0, 10], 1.0),
                                    Rollout("g", 1, ["s0", "s2"], ["c", "d"], [0, 0], 0.0)])
    res = compute_advantages(b, "milegpo", CreditConfig(), drop={"milestones", "traps"})
    lam = CreditConfig().lambda_p
    # s0: +-lam against the anchor mean 0; s1 (+lam), s2 (silent: FAIL only) alone: minus the group mean lam / 4
    assert res.credit.tolist() == [lam, 0.75 * lam, -lam, -0.25 * lam] and res.candidates == []
    gig = compute_advantages(b, "gigpo", CreditConfig())
    assert np.allclose(res.step_advantage - gig.step_advantage, res.credit)


def test_drop_in_config_and_alias():
    b = RolloutBatch.from_rollouts([Rollout("g", 0, ["s0", "s1"], ["a", "b"], [0, 10], 1.0),
                                    Rollout("g", 1, ["s0", "s2"], ["c", "d"], [0, 0], 0.0)])
    via_cfg = compute_advantages(b, "milegpo", CreditConfig(drop=("branch", "milestones")))
    via_arg = compute_advantages(b, "milegpo", CreditConfig(), drop={"same-state", "milestones"})
    assert np.array_equal(via_cfg.advantage, via_arg.advantage)
