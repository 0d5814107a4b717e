"""Supervised warm start on expert walkthroughs (docs/learning.md; a recipe option, off by default).

Score mode: maximise log pi(expert | admissible) under the candidate softmax (cross-entropy over
the admissible set). Generate mode: token cross-entropy of the reply "<action>expert</action>" + eos.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .ppo import num_loss_tokens, sample_logprobs


@dataclass(frozen=True)
class ExpertStep:
    observation: object  # envs.base.Observation
    history: tuple[tuple[str, str], ...]  # (observation text, action) pairs before this step
    steps_taken: int
    action: str  # the expert's action (admissible in this state)


def supervised_warm_start(policy, samples: Sequence[ExpertStep], epochs: int, lr: float,
                          minibatch_size: int = 16, max_grad_norm: float = 1.0,
                          log: Callable[[str], None] | None = None) -> dict[str, float]:
    """Fine-tune ``policy.model`` on the expert steps with AdamW; returns loss before / after and the
    expert-action accuracy (score mode: share of steps whose argmax candidate is the expert's).
    ``log`` gets one line per epoch."""
    if not samples:
        raise ValueError("warmstart: no expert steps")
    if epochs < 1 or lr <= 0:
        raise ValueError(f"warmstart: epochs must be >= 1 and lr > 0 (got epochs={epochs}, lr={lr})")
    start = time.perf_counter()
    train = [policy.make_sample(s.observation, s.history, s.steps_taken, s.action) for s in samples]
    model = policy.model
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    was_training = model.training
    model.train()
    losses = []
    for epoch in range(epochs):
        total, count = 0.0, 0
        for i in torch.randperm(len(train)).split(minibatch_size):
            chunk = [train[j] for j in i.tolist()]
            logp, _, _ = sample_logprobs(model, chunk, policy.pad_id)
            loss = -logp.sum() / num_loss_tokens(chunk)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            optimizer.step()
            total += float(loss.detach()) * logp.numel()
            count += logp.numel()
        losses.append(total / count)
        if log is not None:
            log(f"  supervised epoch {epoch + 1}/{epochs}: loss {losses[-1]:.3f} "
                f"({time.perf_counter() - start:.0f} s)")
    model.train(was_training)
    out = {"warmstart_loss_first_epoch": losses[0], "warmstart_loss_last_epoch": losses[-1],
           "warmstart_steps": len(train), "warmstart_time_s": time.perf_counter() - start}
    if policy.action_mode == "score":
        out["warmstart_accuracy"] = expert_scores(*expert_logprobs(policy, train))["expert_acc"]
    return out


@torch.no_grad()
def expert_logprobs(policy, samples, batch_size: int = 32) -> tuple[list[float], list[bool] | None]:
    """Per sample: log pi(expert action | state) and, in score mode, whether the expert's command is
    the most probable one (None in generate mode), for samples built by ``policy.make_sample``."""
    from milegpo_cli.policy.actions import ScoreSample, candidate_distribution, candidate_logprobs

    was_training = policy.model.training
    policy.model.eval()
    logps, hits = [], []
    try:
        for i in range(0, len(samples), batch_size):
            chunk = samples[i:i + batch_size]
            if not isinstance(chunk[0], ScoreSample):
                logp, _, row = sample_logprobs(policy.model, chunk, policy.pad_id)
                logps.extend(torch.zeros(len(chunk)).index_add_(0, row.cpu(), logp.float().cpu()).tolist())
                continue
            seqs = candidate_logprobs(policy.model, [s.prompt_ids for s in chunk], [s.candidate_ids for s in chunk],
                                      policy.pad_id)
            for s, seq in zip(chunk, seqs):
                dist = candidate_distribution(seq, s.temperature, [len(c) for c in s.candidate_ids] if s.length_norm else None)
                logps.append(float(dist[s.chosen]))
                hits.append(int(dist.argmax()) == s.chosen)
    finally:
        policy.model.train(was_training)
    return logps, (hits if isinstance(samples[0], ScoreSample) else None)


def expert_scores(logps: Sequence[float], hits: Sequence[bool] | None) -> dict[str, float]:
    """``expert_logprobs`` summarised: the mean log pi(expert action | state) and, in score mode, the
    share of states whose most probable command is the expert's."""
    out = {"expert_logp": sum(logps) / len(logps)}
    if hits is not None:
        out["expert_acc"] = sum(hits) / len(hits)
    return out
