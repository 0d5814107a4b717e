"""GraphGPO (arXiv 2605.26684; our reading: docs/algorithms.md, "GraphGPO"): rollouts of a task merged into one graph;
the step return decays with the graph distance to success from the state the step leads to:

    r^G_{i,t} = c * gamma_G ** d(s_{i,t+1}) - [graph_invalid] invalid_penalty * invalid_{i,t}
    A = A^E_i + omega * anchor-normalised r^G_{i,t}

d(SUCCESS) = 0. Where SUCCESS is unreachable r^G = 0 (``graph_unreachable="zero"``) or d = the group's
largest finite distance + 1 (``"farthest"``, recipe/GraphGPO core_graph.all_to_target_shortest_paths).
"""
from __future__ import annotations

import numpy as np

from .anchors import config_anchors
from .batch import RolloutBatch
from .config import CreditConfig
from .gigpo import anchor_normalise
from .graph import RolloutGraph, build_graph
from .grpo import episode_advantage, invalid_penalty
from .result import CreditResult, make_result


def farthest(batch: RolloutBatch, graph: RolloutGraph) -> np.ndarray:
    """Per group: the largest finite distance to SUCCESS over its states (0 when none reaches it)."""
    out = np.zeros(batch.num_groups)
    d = graph.distance[: batch.num_states]
    finite = np.isfinite(d)
    np.maximum.at(out, batch.state_group[finite], d[finite])
    return out


def graph_return(graph: RolloutGraph, c: float, gamma_g: float, unreachable_d: np.ndarray | None = None) -> np.ndarray:
    """r^G per step = c * gamma_G ** d(next node); where SUCCESS is unreachable (d = inf): 0, or
    d = ``unreachable_d`` (per step) when given."""
    d = graph.distance[graph.next_node]
    if unreachable_d is not None:
        d = np.where(np.isfinite(d), d, unreachable_d)
    finite = np.isfinite(d)
    return np.where(finite, c * np.power(gamma_g, np.where(finite, d, 0.0)), 0.0)


def graphgpo(batch: RolloutBatch, config: CreditConfig, drop: frozenset = frozenset()) -> CreditResult:
    graph = build_graph(batch, config.graph_final == "observed")
    rollout_adv, episode_step = episode_advantage(batch, config)
    far = farthest(batch, graph)[batch.step_group] + 1.0 if config.graph_unreachable == "farthest" else None
    r = graph_return(graph, config.graph_c, config.graph_gamma, far)
    if config.graph_invalid:
        r = r - invalid_penalty(batch, config)
    step_adv = anchor_normalise(r, *config_anchors(batch, config), config)
    return make_result(batch.num_steps, episode_step, rollout_adv, step_adv, config.omega)
