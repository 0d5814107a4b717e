"""No unbounded advantage (issue 33): every estimator, every finite input, |A| <= BOUND under the
normalising configurations (mean_std), constant groups and invalid-action penalties included."""
import numpy as np
from hypothesis import given, settings, strategies as st

from milegpo_cli.credit import ALGORITHMS, CreditConfig, Rollout, RolloutBatch, compute_advantages
from milegpo_cli.credit.registry import ESTIMATORS

BOUND = 1e3
SETTINGS = settings(max_examples=80, deadline=None)
MAGNITUDES = [0.0, 1e-9, 0.1, 1.0, 10.0, 1e4, 1e8]  # outcomes (the preset scores 10 x success instead)
REWARDS = [0.0, 1e-9, 1.0, 1e4, 1e8]  # step rewards only enter through normalised returns


@st.composite
def groups(draw):
    """Random groups: loops, invalid steps, final states, singletons, constant scores, tiny and huge values."""
    out = []
    for g in range(draw(st.integers(1, 3))):
        n_states = draw(st.integers(1, 4))
        constant = draw(st.booleans())  # every rollout of the group has one outcome
        outcome = draw(st.sampled_from(MAGNITUDES)) * draw(st.sampled_from([-1.0, 1.0]))
        for i in range(draw(st.integers(1, 5))):
            length = draw(st.integers(1, 6))
            states = ["s0"] + [f"s{draw(st.integers(0, n_states))}" for _ in range(length - 1)]
            scale = draw(st.sampled_from(REWARDS))
            out.append(Rollout(
                f"g{g}", i, states, [draw(st.sampled_from("ab")) for _ in range(length)],
                [scale * draw(st.sampled_from([0.0, 1.0, -1.0, 1e-7])) for _ in range(length)],
                outcome if constant else draw(st.sampled_from(MAGNITUDES)),
                success=draw(st.booleans()),
                invalid=[draw(st.booleans()) for _ in range(length)],
                final_state=draw(st.one_of(st.none(), st.sampled_from(["s0", "s1", "elsewhere"])))))
    return out


CONFIGS = [CreditConfig(), CreditConfig(invalid_penalty=0.1), CreditConfig(invalid_penalty=0.1, episode_stats="steps"),
           CreditConfig(preset="verl-agent"), CreditConfig(preset="verl-agent", graph_gamma=0.1, hgpo_base_group=True),
           CreditConfig(formulation="paper", invalid_penalty=0.1), CreditConfig(formulation="v2", invalid_penalty=0.1),
           CreditConfig(invalid_penalty=5.0, eps=1e-12, graph_final="observed", graph_unreachable="farthest",
                        graph_invalid=True)]


@SETTINGS
@given(groups())
def test_every_estimator_is_bounded(rollouts):
    b = RolloutBatch.from_rollouts(rollouts)
    for algo in ALGORITHMS:
        for cfg in CONFIGS:
            res = compute_advantages(b, algo, cfg)
            for arr in (res.advantage, res.episode_advantage, res.step_advantage):
                assert np.isfinite(arr).all()
                assert np.abs(arr).max(initial=0.0) <= BOUND, (algo, cfg)


def test_constant_group_with_an_invalid_step_gets_minus_the_penalty_not_minus_1e5():
    """The hazard of issue 33: two identical winning rollouts, one step flagged invalid, rollout statistics."""
    rollouts = [Rollout("g", i, ["a", "b"], ["x", "y"], [0.0, 1.0], 1.0, invalid=[i == 0, False]) for i in range(2)]
    b = RolloutBatch.from_rollouts(rollouts)
    for algo in ("grpo", "gigpo", "graphgpo"):
        res = compute_advantages(b, algo, CreditConfig(invalid_penalty=0.1))
        # std of the scores is 0: A^E = 0 everywhere, the flagged row -0.1 (the penalty in advantage units)
        assert np.allclose(res.episode_advantage, [-0.1, 0.0, 0.0, 0.0])


def test_the_diagnostic_estimators_are_bounded_too():
    rollouts = [Rollout("g", i, ["a", "b"], ["x", "y"], [0.0, 1e8], 1e8, invalid=[True, False],
                        subgoals=[[], ["goal"]]) for i in range(3)]
    b = RolloutBatch.from_rollouts(rollouts)
    for algo in ESTIMATORS:
        assert np.abs(compute_advantages(b, algo, CreditConfig(invalid_penalty=0.1)).advantage).max() <= BOUND
