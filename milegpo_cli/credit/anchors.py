"""Anchor groups: the steps of a group whose states count as "the same state" (GiGPO's step groups).

Exact match of the state key (default, ``similarity_thresh = 1``) or verl-agent's similarity
clustering (``enable_similarity``, gigpo/core_gigpo.py ``build_step_group``): within a group, in
batch order, each observation joins the first cluster whose first member has
``difflib.SequenceMatcher(None, a, b).ratio() >= thresh``, else opens a new cluster. Identical keys
always make the same choices, so clustering the distinct keys of a group in first-occurrence order
(the order of the interned state ids) gives verl-agent's clusters. ``real_quick_ratio`` and
``quick_ratio`` are upper bounds of ``ratio``, so testing them first changes no decision; the length
bound 2 min(|a|, |b|) / (|a| + |b|) is checked for all representatives at once.
"""
from __future__ import annotations

from difflib import SequenceMatcher

import numpy as np

from .batch import RolloutBatch


def cluster_keys(keys: list[str], thresh: float) -> np.ndarray:
    """Greedy first-fit clustering of ``keys`` (in order) against each cluster's first member.

    As verl-agent: ``SequenceMatcher(None, key, rep)`` (ratio is not symmetric in general); one
    matcher per representative keeps the analysis of ``rep`` (its seq2) cached.
    """
    label = np.empty(len(keys), dtype=np.int64)
    matchers: list[SequenceMatcher] = []
    rep_len = np.zeros(len(keys))
    for i, key in enumerate(keys):
        n, r = len(key), len(matchers)
        total = rep_len[:r] + n
        bound = np.where(total > 0, 2.0 * np.minimum(rep_len[:r], n) / np.maximum(total, 1), 1.0)
        chosen = -1
        for c in np.flatnonzero(bound >= thresh):
            m = matchers[c]
            m.set_seq1(key)
            if m.quick_ratio() >= thresh and m.ratio() >= thresh:
                chosen = int(c)
                break
        if chosen < 0:
            chosen = r
            matchers.append(SequenceMatcher(None, "", key))
            rep_len[chosen] = n
        label[i] = chosen
    return label


def state_clusters(batch: RolloutBatch, thresh: float) -> tuple[np.ndarray, int]:
    """Per state id: its anchor cluster id (exact: the state itself), and the number of clusters."""
    if thresh >= 1.0:
        return np.arange(batch.num_states, dtype=np.int64), batch.num_states
    out = np.empty(batch.num_states, dtype=np.int64)
    order = np.argsort(batch.state_group, kind="stable")  # ids ascend = first occurrence within a group
    bounds = np.flatnonzero(np.diff(batch.state_group[order])) + 1
    total = 0
    for ids in np.split(order, bounds):
        if ids.size == 0:
            continue
        labels = cluster_keys([batch.state_keys[i] for i in ids], thresh)
        out[ids] = labels + total
        total += int(labels.max()) + 1
    return out, total


def step_anchors(batch: RolloutBatch, thresh: float = 1.0, visits: bool = False) -> tuple[np.ndarray, int]:
    """Per step: its anchor group id (within its group), and the number of anchor groups.

    ``visits``: key the groups by (cluster, k-th visit in the rollout) (``visit_anchors``).
    """
    cluster, count = state_clusters(batch, thresh)
    anchor = cluster[batch.step_state]
    return visit_anchors(batch, anchor, count) if visits else (anchor, count)


def config_anchors(batch: RolloutBatch, config) -> tuple[np.ndarray, int]:
    """The anchor groups a CreditConfig asks for (``similarity_thresh``, ``anchor_visits``)."""
    return step_anchors(batch, config.similarity_thresh, config.anchor_visits)


def visit_anchors(batch: RolloutBatch, anchor: np.ndarray, num_anchors: int) -> tuple[np.ndarray, int]:
    """Per step: id of (anchor, k) with k = earlier visits of that anchor in the same rollout.

    Centring over these groups compares the k-th visit of a state in one rollout with the k-th visit
    in another, so a group of identical rollouts gives every group one value (centred: 0), loops
    included.
    """
    n = batch.num_steps
    if n == 0:
        return np.zeros(0, dtype=np.int64), 0
    key = batch.step_rollout * max(num_anchors, 1) + anchor
    order = np.argsort(key, kind="stable")  # steps of a rollout are in time order already
    sorted_key = key[order]
    start = np.r_[True, sorted_key[1:] != sorted_key[:-1]]
    run_start = np.maximum.accumulate(np.where(start, np.arange(n), 0))
    k = np.empty(n, dtype=np.int64)
    k[order] = np.arange(n) - run_start
    combined = anchor * (int(k.max()) + 1) + k
    ids, inverse = np.unique(combined, return_inverse=True)
    return inverse.astype(np.int64), int(ids.size)
