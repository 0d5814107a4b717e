"""Credit diagnostics: AUC, sign accuracy, milestone precision/recall, intervals over groups."""
import numpy as np
import pytest

from milegpo_cli.experiments import diagnostics as D


def test_auc_by_hand_with_ties():
    # good: 0.5, 0.2, 0.2; bad: 0.2, -1.0. Pairs (good, bad): 0.5 beats both (2), each 0.2 ties
    # 0.2 (0.5) and beats -1 (1): AUC = (2 + 1.5 + 1.5) / 6.
    scores = [0.5, 0.2, 0.2, 0.2, -1.0]
    good = [True, True, True, False, False]
    assert D.roc_auc(scores, good) == pytest.approx(5 / 6)
    assert D.roc_auc(scores, [not g for g in good]) == pytest.approx(1 / 6)
    assert np.isnan(D.roc_auc([1.0, 2.0], [True, True]))  # one class only
    with pytest.raises(D.DiagnosticsError, match="labels"):
        D.roc_auc([1.0], [True, False])


def test_sign_accuracy_counts_zero_as_half():
    # good 1.0 right, good 0.0 half, bad -2.0 right, bad 0.5 wrong -> 2.5 / 4
    assert D.sign_accuracy([1.0, 0.0, -2.0, 0.5], [True, True, False, False]) == pytest.approx(0.625)


def test_milestone_match():
    entered = ["a", "b", "c", "b", "FAIL"]
    subgoals = [(), ("picked",), (), ("picked",), ()]
    m = D.milestone_match(entered, subgoals, discovered={"b", "c"})
    assert (m.discovered, m.true, m.subgoals, m.found) == (2, 1, 1, 1)
    m = D.milestone_match(["x", "y"], [("picked",), ("heated",)], discovered={"y"})
    assert (m.discovered, m.true, m.subgoals, m.found) == (1, 1, 2, 1)


def test_diagnose_credit_intervals_over_groups():
    rng = np.random.default_rng(0)
    n_groups, per = 12, 10
    group = np.repeat(np.arange(n_groups), per)
    good = rng.random(group.size) < 0.5
    adv = np.where(good, 1.0, -1.0) + rng.normal(0, 1.0, group.size)
    labels = [bool(g) for g in good]
    labels[0] = None  # an unlabelled step is left out
    d = D.diagnose_credit(adv, group, labels, name="x", n_resamples=300, seed=3)
    keep = np.arange(group.size) != 0
    assert d.n_steps == group.size - 1
    assert d.auc.value == pytest.approx(D.roc_auc(adv[keep], good[keep]))
    assert d.auc.low < d.auc.value < d.auc.high
    assert 0.5 < d.auc.value <= 1.0
    assert d.sign_accuracy.value == pytest.approx(D.sign_accuracy(adv[keep], good[keep]))
    assert d.milestone_precision is None
    # milestone ratios pooled over groups
    matches = [D.MilestoneMatch(2, 1, 2, 1)] * 6 + [D.MilestoneMatch(1, 1, 1, 1)] * 6
    d = D.diagnose_credit(adv, group, labels, milestones=matches, n_resamples=300)
    assert d.milestone_precision.value == pytest.approx(12 / 18)
    assert d.milestone_recall.value == pytest.approx(12 / 18)
    assert d.counts == {"discovered": 18, "true": 12, "subgoals": 18, "found": 12}


def test_diagnose_and_the_credit_bench_share_one_bootstrap():
    """diagnose's intervals are the credit benchmark's (one GroupBootstrap). Groups 0-3 have good steps
    only: a resample that draws neither group 4 nor 5 (~9 % of them) has no bad step and no AUC; it is
    left out of the percentiles, where scipy's bootstrap made the whole interval NaN and diagnose
    printed a zero-width [value, value]."""
    rng = np.random.default_rng(1)
    group = np.repeat(np.arange(6), 6)
    good = (group < 4) | (np.arange(group.size) % 2 == 0)
    adv = np.where(good, 0.5, -0.5) + rng.normal(0, 1.0, group.size)
    d = D.diagnose_credit(adv, group, [bool(g) for g in good], n_resamples=400, seed=5)
    boot = D.GroupBootstrap(group, good, np.ones(group.size, bool), 6, n_resamples=400, seed=5)
    assert d.auc == boot.auc(adv) and d.sign_accuracy == boot.sign_accuracy(adv)
    assert d.auc.low < d.auc.value < d.auc.high
