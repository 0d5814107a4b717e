"""The milestone and trap memory across iterations of a task (``credit.memory``; docs/algorithms.md,
"Memory across iterations"; DESIGN.md §2.5 principle 5).

What a task's earlier groups showed is kept as decayed counts keyed by state key, and added to the
evidence of its later groups before MileGPO v3 selects, weighs and gates candidates. With delta the
decay per iteration, the memory of task tau after iteration i is

    m(x)   = sum_{i' <= i} delta^(i - i') n_{i'}(x)      for n = n+, n-, failed-rollout visits of state x
    M, M+  = sum_{i' <= i} delta^(i - i') N_{i'}, N+_{i'}  (rollouts, successes)
    w(x,y) = sum_{i' <= i} delta^(i - i') e_{i'}(x, y)   (observed transitions, y may be SUCCESS)

and a group g of tau played at iteration j > i recalls it aged to j, delta^(j - i) m: its counts
become n(v) + delta^(j - i) m(key v), N + delta^(j - i) M, ..., and its graph gains the recalled
transitions of weight >= ``memory_floor`` (a recalled state the group did not visit is an extra node),
so that d(v), the distance to SUCCESS, is finite where an earlier iteration reached SUCCESS from v.
Causal: a group recalls only iterations < its own; groups of the same iteration never see each other.

Bounded: after every fold, entries of weight < ``memory_floor`` are dropped (an entry not refreshed
lives at most log(floor) / log(delta) iterations) and at most ``memory_states`` states (the most
visited) and 4 x ``memory_states`` transitions are kept per task: O(memory_states) per task of the
pool, whatever the number of iterations.

Pure: mappings in, mappings and arrays out; the trainer keeps the mapping in the store.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping

import numpy as np

from .batch import CreditError, RolloutBatch
from .evidence import StateEvidence
from .graph import RolloutGraph, distance_to

SUCCESS_KEY = None  # edge target of the SUCCESS terminal (state keys are strings, any string)
EDGES_PER_STATE = 4


@dataclass(frozen=True)
class TaskMemory:
    """One task's decayed evidence, as of ``iteration`` (the last iteration folded in)."""

    iteration: int
    rollouts: float
    successes: float
    states: Mapping[str, tuple[float, float, float]]  # key -> (n+, n-, failed-rollout visits)
    edges: Mapping[tuple[str, str | None], float]  # (key u, key v or SUCCESS_KEY) -> transitions

    def aged(self, iteration: int, decay: float) -> "TaskMemory":
        """The same memory seen from ``iteration`` (>= self.iteration): every weight times decay^gap."""
        f = decay ** (iteration - self.iteration)
        return TaskMemory(iteration, f * self.rollouts, f * self.successes,
                          {k: (f * a, f * b, f * c) for k, (a, b, c) in self.states.items()},
                          {e: f * w for e, w in self.edges.items()})

    def size(self) -> int:
        return len(self.states) + len(self.edges)

    def to_dict(self) -> dict:
        """JSON form (the store's ``task_memory.memory``): states as [key, n+, n-, fail visits], transitions as
        [index of u, index of v or -1 for SUCCESS, weight]; floats round-trip exactly."""
        index = {k: i for i, k in enumerate(self.states)}
        return {"iteration": self.iteration, "rollouts": self.rollouts, "successes": self.successes,
                "states": [[k, *v] for k, v in self.states.items()],
                "edges": [[index[u], -1 if v is SUCCESS_KEY else index[v], w] for (u, v), w in self.edges.items()]}

    @classmethod
    def from_dict(cls, d: dict) -> "TaskMemory":
        keys = [row[0] for row in d["states"]]
        return cls(int(d["iteration"]), float(d["rollouts"]), float(d["successes"]),
                   {k: (float(a), float(b), float(c)) for k, a, b, c in d["states"]},
                   {(keys[u], SUCCESS_KEY if v < 0 else keys[v]): float(w) for u, v, w in d["edges"]})


Memory = Mapping[str, TaskMemory]


@dataclass(frozen=True, eq=False)
class Recall:
    """What each group of a batch recalls, in the batch's ids (arrays of zeros where nothing)."""

    n_pos: np.ndarray  # per state id
    n_neg: np.ndarray
    fail_visits: np.ndarray
    rollouts: np.ndarray  # per group
    successes: np.ndarray
    edge_src: np.ndarray  # recalled transitions, node ids; extra nodes from num_states + 2 on
    edge_dst: np.ndarray
    num_nodes: int  # num_states + 2 + extra nodes


def fold(memory: TaskMemory | None, part: TaskMemory, decay: float, floor: float, max_states: int) -> TaskMemory:
    """memory aged to part.iteration plus part, pruned to its bound (entries >= floor, the most visited states)."""
    if memory is None:
        total = part
    else:
        old = memory.aged(part.iteration, decay)
        states = dict(old.states)
        for k, v in part.states.items():
            a = states.get(k, (0.0, 0.0, 0.0))
            states[k] = (a[0] + v[0], a[1] + v[1], a[2] + v[2])
        edges = dict(old.edges)
        for e, w in part.edges.items():
            edges[e] = edges.get(e, 0.0) + w
        total = TaskMemory(part.iteration, old.rollouts + part.rollouts, old.successes + part.successes, states, edges)
    # the heaviest first, ties in insertion order (the same after a store round trip)
    keep = sorted((k for k, v in total.states.items() if v[0] + v[1] >= floor),
                  key=lambda k: total.states[k][0] + total.states[k][1], reverse=True)
    states = {k: total.states[k] for k in keep[:max_states]}
    edges = sorted((e for e, w in total.edges.items()
                    if w >= floor and e[0] in states and (e[1] in states or e[1] is SUCCESS_KEY)),
                   key=total.edges.__getitem__, reverse=True)
    return TaskMemory(total.iteration, total.rollouts, total.successes, states,
                      {e: total.edges[e] for e in edges[:EDGES_PER_STATE * max_states]})


def group_parts(batch: RolloutBatch, graph: RolloutGraph, ev: StateEvidence) -> list[TaskMemory]:
    """Each group's own counts as a TaskMemory of its iteration (transitions into FAIL are not kept)."""
    s = batch.num_states
    src, dst = batch.step_state, graph.next_node
    keep = dst != s + 1
    pair = np.unique(np.stack([batch.step_group[keep], src[keep], dst[keep]]), axis=1, return_counts=True)
    edges: list[dict] = [{} for _ in range(batch.num_groups)]
    for g, u, v, c in zip(*pair[0].tolist(), pair[1].tolist()):
        edges[g][(batch.state_keys[u], SUCCESS_KEY if v == s else batch.state_keys[v])] = float(c)
    states: list[dict] = [{} for _ in range(batch.num_groups)]
    seen = (ev.n_pos + ev.n_neg + ev.fail_visits) > 0
    for x in np.flatnonzero(seen).tolist():
        states[batch.state_group[x]][batch.state_keys[x]] = (float(ev.n_pos[x]), float(ev.n_neg[x]),
                                                               float(ev.fail_visits[x]))
    it = batch.group_iteration
    return [TaskMemory(int(it[g]), float(ev.group_n[g]), float(ev.group_pos[g]), states[g], edges[g])
            for g in range(batch.num_groups)]


def recall(memory: Memory, batch: RolloutBatch, graph: RolloutGraph, ev: StateEvidence, decay: float, floor: float,
           max_states: int) -> tuple[Recall, dict[str, TaskMemory]]:
    """What every group with a task recalls from ``memory`` and from the batch's earlier iterations of
    its task, and the memory after folding in every group (module docstring). Groups are taken in
    iteration order; a group's iteration must be later than its task's memory."""
    s, n_groups = batch.num_states, batch.num_groups
    out = {k: np.zeros(s) for k in ("n_pos", "n_neg", "fail_visits")}
    rollouts, successes = np.zeros(n_groups), np.zeros(n_groups)
    src: list[int] = []
    dst: list[int] = []
    extra = 0
    memories = dict(memory)
    if batch.group_task is None:
        return Recall(out["n_pos"], out["n_neg"], out["fail_visits"], rollouts, successes, np.zeros(0, np.int64),
                      np.zeros(0, np.int64), s + 2), memories
    parts = group_parts(batch, graph, ev)
    ids: list[dict] = [{} for _ in range(n_groups)]
    for x in range(s):
        ids[batch.state_group[x]][batch.state_keys[x]] = x
    tasked = [g for g in range(n_groups) if batch.group_task[g] is not None]
    for it in sorted({int(batch.group_iteration[g]) for g in tasked}):
        level = [g for g in tasked if batch.group_iteration[g] == it]
        for g in level:
            old = memories.get(batch.group_task[g])
            if old is None:
                continue
            if old.iteration >= it:
                raise CreditError(f"iteration: group {batch.group_names[g]!r} of task {batch.group_task[g]!r} is at "
                                 f"iteration {it}, its memory already holds iteration {old.iteration}")
            f = decay ** (it - old.iteration)  # the memory aged to this iteration
            rollouts[g], successes[g] = f * old.rollouts, f * old.successes
            local = dict(ids[g])  # recalled states the group did not visit become extra nodes here
            for k, (a, b, c) in old.states.items():
                x = local.get(k)
                if x is not None:
                    out["n_pos"][x], out["n_neg"][x], out["fail_visits"][x] = f * a, f * b, f * c
            for (ku, kv), w in old.edges.items():
                if f * w < floor:
                    continue
                nodes = []
                for k in (ku, kv):
                    x = s if k is SUCCESS_KEY else local.get(k)
                    if x is None:
                        x = local[k] = s + 2 + extra
                        extra += 1
                    nodes.append(x)
                src.append(nodes[0])
                dst.append(nodes[1])
        for g in level:  # after the whole level: groups of one iteration never see each other
            task = batch.group_task[g]
            memories[task] = fold(memories.get(task), parts[g], decay, floor, max_states)
    return Recall(out["n_pos"], out["n_neg"], out["fail_visits"], rollouts, successes,
                  np.asarray(src, np.int64), np.asarray(dst, np.int64), s + 2 + extra), memories


def with_recall(batch: RolloutBatch, graph: RolloutGraph, ev: StateEvidence,
                rec: Recall) -> tuple[RolloutGraph, StateEvidence]:
    """The group graphs' distances to SUCCESS over observed + recalled transitions, and the counts plus recalled counts."""
    s = batch.num_states
    distance = distance_to(np.concatenate([batch.step_state, rec.edge_src]),
                           np.concatenate([graph.next_node, rec.edge_dst]), rec.num_nodes, s)[:s + 2]
    return (replace(graph, distance=distance),
            replace(ev, n_pos=ev.n_pos + rec.n_pos, n_neg=ev.n_neg + rec.n_neg,
                    fail_visits=ev.fail_visits + rec.fail_visits, group_n=ev.group_n + rec.rollouts,
                    group_pos=ev.group_pos + rec.successes))


def window(decay: float, floor: float) -> float:
    """Iterations an entry of weight 1 lives without being refreshed: log(floor) / log(decay) (inf for decay 1)."""
    return math.inf if decay >= 1 else math.log(floor) / math.log(decay)
