"""GraphGPO (arXiv 2605.26684; our reading: docs/algorithms.md, "GraphGPO"): rollouts of a task merged into one graph;
the step return decays with the graph distance to success from the state the step leads to:

    r^G_{i,t} = c * gamma_G ** d(s_{i,t+1})     (0 when SUCCESS is unreachable; d(SUCCESS) = 0)
    A = A^E_i + omega * anchor-normalised r^G_{i,t}
"""
from __future__ import annotations

import numpy as np

from .anchors import config_anchors
from .batch import RolloutBatch
from .config import CreditConfig
from .gigpo import anchor_normalise
from .graph import RolloutGraph, build_graph
from .grpo import episode_advantage
from .result import CreditResult, make_result


def graph_return(graph: RolloutGraph, c: float, gamma_g: float) -> np.ndarray:
    """r^G per step = c * gamma_G ** d(next node); unreachable (d = inf) gives 0."""
    d = graph.distance[graph.next_node]
    return np.where(np.isfinite(d), c * np.power(gamma_g, np.where(np.isfinite(d), d, 0.0)), 0.0)


def graphgpo(batch: RolloutBatch, config: CreditConfig, drop: frozenset = frozenset()) -> CreditResult:
    graph = build_graph(batch)
    rollout_adv, episode_step = episode_advantage(batch, config)
    step_adv = anchor_normalise(graph_return(graph, config.graph_c, config.graph_gamma),
                                *config_anchors(batch, config), config)
    return make_result(batch.num_steps, episode_step, rollout_adv, step_adv, config.omega)
