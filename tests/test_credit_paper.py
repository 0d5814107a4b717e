"""The paper formulation (docs/algorithms.md): eta = 0 is GraphGPO exactly; credit within its stated bounds."""
import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from milegpo_cli.credit import CreditConfig, Rollout, RolloutBatch, compute_advantages, same_state_tie_share
from milegpo_cli.credit.config import PaperConfig
from milegpo_cli.credit.graph import decayed_max

from test_credit_properties import rollout_lists

SETTINGS = settings(max_examples=60, deadline=None)


@SETTINGS
@given(rollout_lists())
def test_eta_zero_reproduces_graphgpo_exactly(rollouts):
    b = RolloutBatch.from_rollouts(rollouts)
    paper = compute_advantages(b, "milegpo", CreditConfig(formulation="paper", paper=PaperConfig(eta=0.0)))
    graph = compute_advantages(b, "graphgpo", CreditConfig())
    assert np.array_equal(paper.advantage, graph.advantage)


@SETTINGS
@given(rollout_lists(), st.floats(0.05, 1.0), st.floats(0.0, 2.0), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_paper_credit_within_stated_bounds(rollouts, omega, gamma_phi, w_plus, w_minus):
    cfg = CreditConfig(formulation="paper", paper=PaperConfig(omega=omega, gamma_phi=gamma_phi, w_plus=w_plus,
                                                              w_minus=w_minus))
    res = compute_advantages(RolloutBatch.from_rollouts(rollouts), "milegpo", cfg)
    scale = cfg.graph_c * cfg.paper.lambda_ * gamma_phi
    assert (res.credit <= scale * w_plus + 1e-9).all() and (res.credit >= -scale * w_minus - 1e-9).all()
    for c in res.candidates:
        assert -1.0 <= c.rho <= 1.0 and (c.rho > 0) == (c.kind == "milestone")


def test_decayed_max_matches_brute_force():
    rng = np.random.default_rng(0)
    n = 12
    src, dst = rng.integers(0, n, 40), rng.integers(0, n, 40)
    value = np.where(rng.random(n) < 0.3, rng.random(n), 0.0)
    phi = decayed_max(src, dst, n, value, 0.5)
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from(zip(src.tolist(), dst.tolist()))
    for x in range(n):
        d = nx.single_source_shortest_path_length(g, x)
        best = max([value[v] * 0.5 ** d[v] for v in d if value[v] > 0], default=0.0)
        assert phi[x] == pytest.approx(best)


def test_paper_potentials_hand_computed():
    # r0, r1: s0 -> m -> SUCCESS; r2, r3: s0 -> t -> t -> FAIL. p̄ = 1/2.
    rows = [("g", i, ["s0", "m"], ["a", "b"], [0, 10], 1.0) for i in range(2)]
    rows += [("g", 2 + i, ["s0", "t", "t"], ["c", "d", "d"], [0, 0, 0], 0.0) for i in range(2)]
    b = RolloutBatch.from_rollouts([Rollout(*r) for r in rows])
    res = compute_advantages(b, "milegpo", CreditConfig(formulation="paper", eps=1e-12))
    kinds = {c.key: (c.kind, c.rho) for c in res.candidates}
    assert kinds == {"m": ("milestone", 1.0), "t": ("trap", -1.0)}  # one candidate each: max-normalised to 1
    # Phi+(s0) = 0.2, Phi+(m) = 1; Phi-(s0) = 0.2, Phi-(t) = 1. c lambda = 2.5
    # s0 -> m: delta+ = 1 - 0.2 = 0.8, delta- = max(0 - 0.25 * 0.2, 0) = 0 -> 2.0
    # s0 -> t: delta+ = 0, delta- = 0.25 * 1 - 0.25 * 0.2 = 0.2 -> -0.5; t -> t and into terminals: 0
    assert np.allclose(res.credit, [2.0, 0.0, 2.0, 0.0, -0.5, 0.0, 0.0, -0.5, 0.0, 0.0])
    graph = compute_advantages(b, "graphgpo", CreditConfig(eps=1e-12))
    # anchor s0: r_G = {2, 2, 0, 0} and r_mix = {4, 4, -0.5, -0.5}: both normalise to +-sqrt(3)/2
    assert np.allclose(res.step_advantage, graph.step_advantage)
    # anchor t (both steps of r2, r3 at t): r_G = 0 and credit 0 -> 0; the eta mix changes nothing here
    mean = compute_advantages(b, "milegpo", CreditConfig(formulation="paper", step_norm="mean", paper=PaperConfig(eta=0.5)))
    # mean-norm anchor s0: Â_G = {1, 1, -1, -1}, Â_mix = {2.25, 2.25, -2.25, -2.25} -> 1 + 0.5 * 1.25
    assert mean.step_advantage[0] == pytest.approx(1.625) and mean.step_advantage[4] == pytest.approx(-1.625)


def test_paper_ablations_stay_meaningful():
    rows = [("g", i, ["s0", "m"], ["a", "b"], [0, 10], 1.0) for i in range(2)]
    rows += [("g", 2 + i, ["s0", "t", "t"], ["c", "d", "d"], [0, 0, 0], 0.0) for i in range(2)]
    b = RolloutBatch.from_rollouts([Rollout(*r) for r in rows])
    cfg = CreditConfig(formulation="paper")
    no_m = compute_advantages(b, "milegpo", cfg, drop={"milestones"})
    assert no_m.credit.max() == 0.0 and no_m.credit.min() < 0
    no_t = compute_advantages(b, "milegpo", cfg, drop={"traps"})
    assert no_t.credit.min() == 0.0 and no_t.credit.max() > 0
    none = compute_advantages(b, "milegpo", cfg, drop={"milestones", "traps"})
    assert np.array_equal(none.advantage, compute_advantages(b, "graphgpo", cfg).advantage)


def test_same_state_tie_share_hand_computed():
    # at s0: steps with actions a, a, b, c; advantages 1, 1, 1, 2
    rows = [("g", 0, ["s0"], ["a"], [0], 1.0), ("g", 1, ["s0"], ["a"], [0], 1.0),
            ("g", 2, ["s0"], ["b"], [0], 1.0), ("g", 3, ["s0"], ["c"], [0], 0.0)]
    b = RolloutBatch.from_rollouts([Rollout(*r) for r in rows])
    # distinct-action pairs: (0,2) (0,3) (1,2) (1,3) (2,3) = 5; tied: (0,2) (1,2) = 2
    assert same_state_tie_share(b, np.array([1.0, 1.0, 1.0, 2.0])) == pytest.approx(2 / 5)
    assert same_state_tie_share(b, np.array([1.0, 2.0, 3.0, 4.0])) == 0.0
    single = RolloutBatch.from_rollouts([Rollout("g", 0, ["s0", "s1"], ["a", "b"], [0, 0], 1.0)])
    assert np.isnan(same_state_tie_share(single, np.zeros(2)))
    with pytest.raises(ValueError, match="step_advantage"):
        same_state_tie_share(b, np.zeros(3))
