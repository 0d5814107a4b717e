"""The group rollout graph (docs/algorithms.md): nodes = interned state ids plus SUCCESS and FAIL terminals,
edges = observed transitions kappa(s_t) -> kappa(s_{t+1}); the last step of a rollout enters SUCCESS
or FAIL. Groups never share a state id, so one graph over the whole batch holds every group graph
as a disconnected component, and a single SUCCESS / FAIL node pair serves all groups.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra

from .batch import RolloutBatch


@dataclass(frozen=True, eq=False)
class RolloutGraph:
    next_node: np.ndarray  # per step: node of s_{t+1}; SUCCESS / FAIL for a rollout's last step
    first_visit: np.ndarray  # per step: s_t is visited for the first time in its rollout
    distance: np.ndarray  # per node (num_states + 2): fewest observed steps to SUCCESS, inf if unreachable
    success: int  # node id of SUCCESS (num_states); FAIL is num_states + 1

    @property
    def num_nodes(self) -> int:
        return self.success + 2


def next_nodes(batch: RolloutBatch, observed_final: bool = False) -> np.ndarray:
    """kappa(s_{t+1}) per step, SUCCESS (= S) or FAIL (= S + 1) after the last step.

    ``observed_final``: the last step of a failed rollout that records its ``final_state`` enters
    that state instead of FAIL (recipe/GraphGPO's rollout_loop keeps the environment's real next
    observation; only a success is replaced by the success node).
    """
    nxt = np.empty(batch.num_steps, dtype=np.int64)
    nxt[:-1] = batch.step_state[1:]
    last = batch.step_last
    end = np.where(batch.step_success[last], batch.num_states, batch.num_states + 1)
    if observed_final and batch.rollout_final is not None:
        final = batch.rollout_final[batch.step_rollout[last]]
        end = np.where(~batch.step_success[last] & (final >= 0), final, end)
    nxt[last] = end
    return nxt


def first_visits(batch: RolloutBatch) -> np.ndarray:
    """True where step t is the first visit of s_t in its rollout.

    Keyed by (state, rollout index within the group) in a dense table when it is small (states
    are per group, so the table is about states x group size), else by a sort.
    """
    n = batch.num_steps
    mask = np.zeros(n, dtype=bool)
    if n == 0:
        return mask
    first_rollout = np.full(batch.num_groups, batch.num_rollouts, dtype=np.int64)
    np.minimum.at(first_rollout, batch.rollout_group, np.arange(batch.num_rollouts))
    local = batch.step_rollout - first_rollout[batch.step_group]  # rollout index relative to its group's first
    width = int(local.max()) + 1
    if batch.num_states * width <= 8 * n:
        table = np.full(batch.num_states * width, n, dtype=np.int64)
        np.minimum.at(table, batch.step_state * width + local, np.arange(n))
        first = table[table < n]
    else:
        _, first = np.unique(batch.step_rollout * batch.num_states + batch.step_state, return_index=True)
    mask[first] = True
    return mask


def revisited_later(batch: RolloutBatch) -> np.ndarray:
    """True at step t when s_t is visited again later in the same rollout (t starts a loop)."""
    n = batch.num_steps
    mask = np.zeros(n, dtype=bool)
    if n == 0:
        return mask
    key = (batch.step_rollout * batch.num_states + batch.step_state)[::-1]
    _, last_rev = np.unique(key, return_index=True)
    mask[:] = True
    mask[n - 1 - last_rev] = False
    return mask


def stable_argsort(keys: np.ndarray, max_key: int) -> np.ndarray:
    """Stable argsort of non-negative integer keys by 16-bit radix passes (numpy radix-sorts uint16)."""
    if max_key < 1 << 16:
        return np.argsort(keys.astype(np.uint16), kind="stable")
    if max_key < 1 << 32:
        order = np.argsort((keys & 0xFFFF).astype(np.uint16), kind="stable")
        return order[np.argsort((keys[order] >> 16).astype(np.uint16), kind="stable")]
    return np.argsort(keys, kind="stable")


def reversed_csr(src: np.ndarray, dst: np.ndarray, num_nodes: int, weight: np.ndarray | None = None) -> csr_matrix:
    """CSR matrix of the reversed edges dst -> src (parallel edges kept; shortest paths ignore them)."""
    order = stable_argsort(dst, num_nodes)
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=num_nodes), out=indptr[1:])
    data = np.ones(src.size) if weight is None else weight[order]
    return csr_matrix((data, src[order], indptr), shape=(num_nodes, num_nodes))


def distance_to(src: np.ndarray, dst: np.ndarray, num_nodes: int, target: int) -> np.ndarray:
    """d(x) = fewest edges x -> ... -> target (BFS from target on the reversed graph)."""
    return dijkstra(reversed_csr(src, dst, num_nodes), directed=True, indices=target, unweighted=True)


def decayed_max(src: np.ndarray, dst: np.ndarray, num_nodes: int, value: np.ndarray, decay: float) -> np.ndarray:
    """Phi(x) = max_v value[v] * decay ** d(x, v) over nodes v with value > 0 (0 if none reachable).

    Computed as one Dijkstra on the reversed graph from a super source joined to each v by an edge
    of cost -log value[v]; edges cost -log decay, so Phi(x) = exp(-cost(x)).
    """
    targets = np.flatnonzero(value > 0)
    if targets.size == 0:
        return np.zeros(num_nodes)
    edge = np.unique(dst * num_nodes + src)  # reversed, deduplicated (csr would sum duplicate costs)
    step_cost = max(-np.log(decay), 1e-12)  # decay = 1: a vanishing cost keeps the edges explicit
    offset = 1.0  # keeps every super-source edge cost > 0 (scipy drops explicit zeros)
    rows = np.concatenate([edge // num_nodes, np.full(targets.size, num_nodes)])
    cols = np.concatenate([edge % num_nodes, targets])
    cost = np.concatenate([np.full(edge.size, step_cost),
                           offset - np.log(value[targets])])
    g = csr_matrix((cost, (rows, cols)), shape=(num_nodes + 1, num_nodes + 1))
    d = dijkstra(g, directed=True, indices=num_nodes)[:num_nodes] - offset
    return np.where(np.isfinite(d), np.exp(-d), 0.0)


def build_graph(batch: RolloutBatch, observed_final: bool = False) -> RolloutGraph:
    """The group graphs of ``batch``; ``observed_final``: see :func:`next_nodes`."""
    nxt = next_nodes(batch, observed_final)
    s = batch.num_states
    dist = distance_to(batch.step_state, nxt, s + 2, s)
    return RolloutGraph(next_node=nxt, first_visit=first_visits(batch), distance=dist, success=s)
