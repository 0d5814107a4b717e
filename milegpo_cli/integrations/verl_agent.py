"""MileGPO inside verl-agent (github.com/langfengQ/verl-agent, the Ray / FSDP / vLLM engine of GiGPO).

:func:`compute_advantage` takes the arguments of verl-agent's
``gigpo.core_gigpo.compute_gigpo_outcome_advantage`` in the same order, so a verl-agent trainer
changes one call to train with MileGPO, GraphGPO, HGPO, GRPO or our GiGPO (docs/scale.md). HGPO
(``algo="hgpo"``, ``config=verl_agent_config(mode=..., hgpo_history=...)``) reads the step returns as
recipe/hgpo does; GraphGPO builds its graph from the anchor observations, and a verl-agent batch has no
final observation, so a failed trajectory's last step enters FAIL (recipe/GraphGPO's own ``next_obs`` is
what ``milegpo credit`` reads as ``final_state``). verl-agent's
batch has one row per environment step (prompt + one reply); the rows are regrouped into the
project's :class:`~milegpo_cli.credit.RolloutBatch`, the estimator runs on it, and each step's
scalar advantage is put on every response token of its row (0 on padding), as verl-agent does.

Conventions taken from verl-agent's batch:
- ``index``: episode-group uid (the N copies of a task); ``traj_index``: trajectory uid; the rows
  of a trajectory are in step order (they need not be contiguous).
- outcome R_i = the highest ``token_level_rewards.sum(-1)`` of the trajectory's rows (verl-agent
  puts the episode reward, e.g. 10 x success, on every step row, less its invalid-action penalty on
  the rows whose action was invalid: those rows are flagged invalid, ``CreditConfig.invalid_penalty``).
- ``step_rewards`` are verl-agent's already discounted per-step returns G_{i,t} (penalty included):
  they enter the batch as the step rewards with gamma = 0, so the estimators' own discounting is
  the identity.
- state key kappa(s_{i,t}) = the anchor observation (exact match within the group, or verl-agent's
  greedy similarity clustering with ``enable_similarity``: ``CreditConfig.similarity_thresh``).
- ``actions``: the environment actions of the rows when the caller has them. verl-agent does not
  pass them to its advantage function; without them a step's action is identified by the anchor
  observation it led to (a trajectory's last step, whose successor is unseen, by a label of its own).
  Only MileGPO's same-state branch evidence looks at actions.

With ``config=None`` the credit configuration is :func:`verl_agent_config` (verl-agent's own
conventions), and ``algo="gigpo"`` then reproduces ``compute_gigpo_outcome_advantage`` exactly
(bench/verl_agent_parity.py). A ``config`` given is used as is: ``epsilon``, ``step_advantage_w``
and ``mode`` only build the default.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Sequence

import numpy as np
import torch

from ..credit import CreditConfig, Rollout, RolloutBatch, compute_advantages
from ..credit.anchors import cluster_keys
from ..credit.gigpo import discounted_returns

MODES = {"mean_norm": "mean", "mean_std_norm": "mean_std"}


def verl_agent_config(epsilon: float = 1e-6, step_advantage_w: float = 1.0, mode: str = "mean_norm",
                      enable_similarity: bool = False, similarity_thresh: float = 0.95,
                      **overrides) -> CreditConfig:
    """verl-agent's GiGPO conventions for its own tensors: one ``mode`` for the episode and the step
    part, episode statistics over the group's step rows, anchor groups by the observation alone
    (optionally verl-agent's similarity clustering), the row scores as given (they already hold
    10 x success), its invalid-action penalty 0.1, unbiased std; ``overrides`` set any other
    :class:`CreditConfig` field (e.g. MileGPO's lambdas)."""
    if mode not in MODES:
        raise ValueError(f"mode: must be one of {', '.join(MODES)}, got {mode!r}")
    return CreditConfig(**{"episode_norm": MODES[mode], "step_norm": MODES[mode], "episode_stats": "steps",
                           "anchor_visits": False, "zero_identical": False, "episode_score": "outcome", "episode_scale": 1.0,
                           "invalid_penalty": 0.1, "std_unbiased": True, "eps": epsilon, "omega": step_advantage_w,
                           "similarity_thresh": similarity_thresh if enable_similarity else 1.0, **overrides})


def anchor_key(obs) -> str:
    """A string key equal for equal anchor observations (text as is; arrays by dtype, shape, bytes)."""
    if isinstance(obs, str):
        return obs
    if isinstance(obs, (np.ndarray, list, tuple)) or np.isscalar(obs):
        arr = np.asarray(obs)
        if arr.dtype != object:
            return f"{arr.dtype}{arr.shape}:{arr.tobytes().hex()}"
    return repr(obs)


def row_order_clusters(keys: list[str], index, thresh: float) -> list[str]:
    """verl-agent's similarity grouping clusters each group's observations in batch-row order, while
    the batch interns states rollout by rollout: so the rows are clustered here (credit's
    ``cluster_keys``) and each key is replaced by its cluster's first member."""
    out = list(keys)
    rows_of: dict = {}
    for row, g in enumerate(index):
        rows_of.setdefault(g, []).append(row)
    for rows in rows_of.values():
        distinct = list(dict.fromkeys(keys[r] for r in rows))
        labels = cluster_keys(distinct, thresh)
        first: dict = {}
        for key, label in zip(distinct, labels):
            first.setdefault(label, key)
        for r in rows:
            out[r] = first[labels[distinct.index(keys[r])]]
    return out


def rows_to_batch(row_scores: np.ndarray, step_returns: np.ndarray, anchor_obs, index, traj_index,
                  actions: Sequence[str] | None = None, invalid_penalty: float = 0.0,
                  similarity_thresh: float = 1.0) -> tuple[RolloutBatch, np.ndarray]:
    """Regroup step rows into rollouts. Returns the batch and, per flattened batch step, its row.

    A trajectory's outcome is its highest row score; a row scoring ``invalid_penalty`` less is an
    invalid-action row (verl-agent took the penalty off its score and its return; the batch flags it
    and carries the return before the penalty, which the estimators take off again)."""
    n = len(row_scores)
    for name, arr in (("step_rewards", step_returns), ("anchor_obs", anchor_obs), ("index", index),
                      ("traj_index", traj_index)) + ((("actions", actions),) if actions is not None else ()):
        if len(arr) != n:
            raise ValueError(f"{name}: {len(arr)} rows, but token_level_rewards has {n}")
    keys = [anchor_key(o) for o in anchor_obs]
    if similarity_thresh < 1.0:
        keys = row_order_clusters(keys, index, similarity_thresh)
    rows_of: dict = {}
    for row, traj in enumerate(traj_index):
        rows_of.setdefault(traj, []).append(row)
    rollouts = []
    for traj, rows in rows_of.items():
        groups = {index[r] for r in rows}
        if len(groups) != 1:
            raise ValueError(f"traj_index: trajectory {traj!r} has rows in several groups {sorted(map(str, groups))}")
        scores = row_scores[rows]
        outcome = float(scores.max())
        tol = 1e-5 * (1.0 + abs(outcome))  # float32 token sums
        invalid = scores < outcome - tol
        if invalid.any() and (invalid_penalty == 0 or np.abs(outcome - scores[invalid] - invalid_penalty).max() > tol):
            raise ValueError(f"token_level_rewards: the rows of trajectory {traj!r} carry different episode rewards "
                             f"{sorted(set(scores.tolist()))} (an invalid-action row may only differ by "
                             f"invalid_penalty = {invalid_penalty})")
        if actions is not None:
            acts = [str(actions[r]) for r in rows]
        else:  # the transition a step caused; the last step's successor is not in the batch
            acts = [f"-> {keys[r]}" for r in rows[1:]] + [f"-> end of {traj!r}"]
        rollouts.append(Rollout(group=str(index[rows[0]]), rollout_id=str(traj), states=[keys[r] for r in rows],
                                actions=acts, outcome=outcome, invalid=invalid.tolist(),
                                rewards=(step_returns[rows] + invalid_penalty * invalid).tolist()))
    order = np.fromiter((r for rows in rows_of.values() for r in rows), dtype=np.int64, count=n)
    return RolloutBatch.from_rollouts(rollouts), order


def compute_advantage(token_level_rewards: torch.Tensor, step_rewards: torch.Tensor, response_mask: torch.Tensor,
                      anchor_obs, index, traj_index, epsilon: float = 1e-6, step_advantage_w: float = 1.0,
                      mode: str = "mean_norm", enable_similarity: bool = False, similarity_thresh: float = 0.95,
                      *, algo: str = "milegpo", drop: Iterable[str] = (), config: CreditConfig | None = None,
                      actions: Sequence[str] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token advantages of ``algo`` for verl-agent step rows; returns (advantages, returns),
    both shaped like ``response_mask`` (verl-agent returns the advantage twice), in the dtype and
    on the device of ``token_level_rewards``: A_{row} * response_mask[row]."""
    config = config or verl_agent_config(epsilon, step_advantage_w, mode, enable_similarity, similarity_thresh)
    scores = token_level_rewards.detach().sum(dim=-1).double().cpu().numpy()
    returns = torch.as_tensor(step_rewards).detach().reshape(-1).double().cpu().numpy()
    batch, order = rows_to_batch(scores, returns, anchor_obs, index, traj_index, actions, config.invalid_penalty,
                                 config.similarity_thresh)
    result = compute_advantages(batch, algo, replace(config, gamma=0.0, similarity_thresh=1.0), drop)
    per_row = np.empty(len(scores))
    per_row[order] = result.advantage
    mask = response_mask.to(token_level_rewards.dtype)
    adv = torch.as_tensor(per_row, device=mask.device).to(mask.dtype).unsqueeze(-1) * mask
    return adv, adv


def rows_from_rollouts(rollouts: Sequence[Rollout], gamma: float, response_lengths: Sequence[int],
                       max_response_length: int | None = None, dtype=torch.float64,
                       invalid_penalty: float = 0.0) -> dict:
    """The inverse of :func:`rows_to_batch`: the verl-agent step rows of ``rollouts`` (for tests and
    benches). Row k is right-padded to ``max_response_length`` with ``response_lengths[k]`` valid
    tokens; the outcome sits on its last valid token; ``step_rewards`` are the discounted returns;
    a row flagged invalid has ``invalid_penalty`` taken off both, as verl-agent does."""
    batch = RolloutBatch.from_rollouts(rollouts)
    lengths = np.asarray(response_lengths, dtype=np.int64)
    if lengths.shape != (batch.num_steps,) or (lengths < 1).any():
        raise ValueError(f"response_lengths: need {batch.num_steps} lengths >= 1")
    width = int(max_response_length or lengths.max())
    mask = torch.as_tensor(np.arange(width)[None, :] < lengths[:, None], dtype=dtype)
    token_rewards = torch.zeros(batch.num_steps, width, dtype=dtype)
    penalty = invalid_penalty * batch.step_invalid
    token_rewards[torch.arange(batch.num_steps), torch.as_tensor(lengths - 1)] = torch.as_tensor(
        batch.outcome[batch.step_rollout] - penalty, dtype=dtype)
    returns = discounted_returns(batch.reward, batch.offset, batch.length, gamma) - penalty
    traj = [f"{batch.group_names[batch.rollout_group[i]]}#{batch.rollout_ids[i]}" for i in batch.step_rollout]
    return dict(token_level_rewards=token_rewards, step_rewards=torch.as_tensor(returns, dtype=dtype),
                response_mask=mask, anchor_obs=np.array([batch.state_keys[s] for s in batch.step_state], dtype=object),
                index=np.array([batch.group_names[g] for g in batch.step_group], dtype=object),
                traj_index=np.array(traj, dtype=object),
                actions=np.array([batch.action_names[a] for a in batch.step_action], dtype=object))
