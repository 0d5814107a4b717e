"""The two action modes (docs/architecture.md, "Policy and loss") and the log-probabilities the PPO update recomputes.

``score``: pi(a | s) = softmax_a( log p_theta(a | prompt) / T ) over the admissible commands a,
where log p_theta(a | prompt) = sum_j log p_theta(a_j | prompt, a_<j) is the sequence log-probability
of the command's tokens (followed by eos, so that "go to desk 1" is not a prefix of "go to desk 10").
Each prompt is packed with all its candidates into one row (prompt once, candidates back to back,
block attention mask, positions restarting after the prompt), and all rows run as one batch
(:func:`candidate_logprobs`): one forward pass per step for every active rollout, and the same
tokens as a plain loop in the update. The same function, with gradients, gives the update's new
log-probabilities, so rollout and update agree exactly.

``generate``: the model samples a reply at temperature T (no top-k / top-p, so the recorded
log-probs are those of the sampling distribution); the action is parsed from it and projected onto
the admissible commands (policy/replies.py). Per-token log-probs under softmax(logits / T) are
recorded for the loss on the generated tokens. The split forward of Qwen2 / Llama decoders:
policy/split_forward.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from milegpo_cli.errors import MilegpoError

from .split_forward import pack_split, split_forward, split_forward_supported

SPLIT_FORWARD = True  # False: one block-masked pass over whole rows (bench/train_speed.py's baseline)


class PolicyError(MilegpoError, ValueError):
    """Bad input to the policy (no admissible actions, unknown action mode...)."""


@dataclass
class ScoreSample:
    """What the update needs to recompute a score-mode action's log-prob."""

    prompt_ids: list[int]
    candidate_ids: list[list[int]]  # one token list per admissible command (eos appended)
    chosen: int
    temperature: float
    old_logp: float  # log pi_old(chosen) under the candidate softmax
    length_norm: bool = False  # score = mean token log-prob instead of the sum (policy.score_norm = "mean")

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + sum(len(c) for c in self.candidate_ids)


@dataclass
class GenerateSample:
    """What the update needs to recompute a generated reply's per-token log-probs."""

    prompt_ids: list[int]
    response_ids: list[int]
    temperature: float
    old_logps: list[float]  # per response token, log softmax(logits / T)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass
class ActionSample:
    action: str | None  # None: the reply named no admissible command (generate mode) -> penalty
    logp: float  # log-prob of the whole action (score: candidate softmax; generate: sum over tokens)
    sample: ScoreSample | GenerateSample
    reply: str | None = None  # the generated text (generate mode)

    @property
    def invalid(self) -> bool:
        return self.action is None


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def pad(seqs: Sequence[Sequence[int]], pad_id: int, left: bool, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) of shape (len(seqs), max length), padded on the left or the right."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        sl = slice(width - len(s), width) if left else slice(0, len(s))
        ids[i, sl] = torch.as_tensor(list(s), dtype=torch.long)
        mask[i, sl] = 1
    return ids.to(device), mask.to(device)


def pack_candidates(prompts: Sequence[Sequence[int]], candidates: Sequence[Sequence[Sequence[int]]], pad_id: int,
                    device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One row per prompt: prompt + its candidates back to back, right-padded. Returns (ids, positions,
    block mask (B, 1, T, T) bool, row, source column, target column) where, for every candidate token
    (flat, in order), its logit comes from ``ids[row, source]`` and its id is ``ids[row, target]``.
    Position ids restart after the prompt for every candidate, and a candidate token attends to the
    prompt and to its own earlier tokens only, so each candidate sees exactly prompt + itself."""
    rows = [list(p) + [t for c in cs for t in c] for p, cs in zip(prompts, candidates)]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    pos = torch.zeros((len(rows), width), dtype=torch.long)
    block = torch.full((len(rows), width), -1, dtype=torch.long)  # 0: prompt, k: candidate k, -1: padding
    src, tgt, row = [], [], []
    for b, (p, cs) in enumerate(zip(prompts, candidates)):
        ids[b, :len(rows[b])] = torch.as_tensor(rows[b], dtype=torch.long)
        pos[b, :len(p)] = torch.arange(len(p))
        block[b, :len(p)] = 0
        start = len(p)
        for k, c in enumerate(cs, start=1):
            pos[b, start:start + len(c)] = torch.arange(len(p), len(p) + len(c))
            block[b, start:start + len(c)] = k
            src += [len(p) - 1] + list(range(start, start + len(c) - 1))
            tgt += list(range(start, start + len(c)))
            row += [b] * len(c)
            start += len(c)
    causal = torch.ones((width, width), dtype=torch.bool).tril()
    same = (block[:, :, None] == block[:, None, :]) | (block[:, None, :] == 0)
    pad_self = (block[:, :, None] < 0) & torch.eye(width, dtype=torch.bool)  # padding rows see themselves
    mask = ((same & (block[:, None, :] >= 0) & causal) | pad_self)[:, None]
    as_t = partial(torch.as_tensor, dtype=torch.long, device=device)
    return ids.to(device), pos.to(device), mask.to(device), as_t(row), as_t(src), as_t(tgt)


def candidate_logprobs(model, prompts: Sequence[Sequence[int]], candidates: Sequence[Sequence[Sequence[int]]],
                       pad_id: int = 0) -> list[torch.Tensor]:
    """Sequence log-probs log p(c | prompt_b) for every candidate c of every prompt b, in one forward
    pass: :func:`split_forward` for Qwen2/Llama decoders, else one block-masked pass over the packed
    rows of :func:`pack_candidates`. Returns one tensor (len(candidates[b]),) per prompt. Gradients
    flow when enabled."""
    if len(prompts) != len(candidates):
        raise PolicyError(f"candidate_logprobs: {len(prompts)} prompts but {len(candidates)} candidate lists")
    if any(len(p) == 0 for p in prompts) or any(len(cs) == 0 for cs in candidates):
        raise PolicyError("candidate_logprobs: empty prompt or empty candidate list")
    device = model_device(model)
    dtype = next(model.parameters()).dtype
    decoder = model.get_decoder()
    if SPLIT_FORWARD and split_forward_supported(decoder):
        rows = pack_split(prompts, candidates, pad_id, device, dtype)
        logits = model.get_output_embeddings()(split_forward(decoder, rows)[rows.row, rows.src])
        target = rows.target
    else:  # the output head only where a candidate token is predicted (not on prompt and padding positions)
        ids, pos, mask, row, src, tgt = pack_candidates(prompts, candidates, pad_id, device)
        bias = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(~mask, torch.finfo(dtype).min)
        hidden = decoder(input_ids=ids, attention_mask=bias, position_ids=pos, use_cache=False).last_hidden_state
        logits, target = model.get_output_embeddings()(hidden[row, src]), ids[row, tgt]
    tok_logp = F.log_softmax(logits.float(), dim=-1).gather(-1, target[:, None]).squeeze(-1)
    lengths = [len(c) for cs in candidates for c in cs]
    cand = torch.repeat_interleave(torch.arange(len(lengths), device=device), torch.as_tensor(lengths, device=device))
    seq_logp = torch.zeros(len(lengths), dtype=tok_logp.dtype, device=device).index_add(0, cand, tok_logp)
    return list(seq_logp.split([len(cs) for cs in candidates]))


def token_logprobs(model, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
                   temperature: float | Sequence[float] = 1.0, pad_id: int = 0, with_entropy: bool = False):
    """Per-token log softmax(logits / T) of each response given its prompt, one right-padded batch of
    prompt + response. Returns (logp, entropy or None, row), flat over all response tokens; ``row``
    is the index of the response each token belongs to."""
    device = model_device(model)
    ids, mask = pad([list(p) + list(r) for p, r in zip(prompts, responses)], pad_id, left=False, device=device)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
    p_len = torch.tensor([len(p) for p in prompts], device=device)[:, None]
    r_len = torch.tensor([len(r) for r in responses], device=device)[:, None]
    target_pos = torch.arange(1, ids.shape[1], device=device)[None, :]  # token predicted at column j
    sel = (target_pos >= p_len) & (target_pos < p_len + r_len)
    row = torch.arange(ids.shape[0], device=device)[:, None].expand_as(sel)[sel]
    temps = torch.as_tensor(temperature, dtype=torch.float32, device=device).reshape(-1).expand(ids.shape[0])
    logp_all = F.log_softmax(logits[sel].float() / temps[row, None], dim=-1)  # response positions only
    logp = logp_all.gather(-1, ids[:, 1:][sel][:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    return logp, entropy, row


def candidate_distribution(seq_logp: torch.Tensor, temperature: float, lengths: Sequence[int] | None = None) -> torch.Tensor:
    """log pi(a) = log_softmax(score(a) / T) over the candidates, score = seq_logp, or seq_logp / len(a)
    when ``lengths`` are given (length-normalised: removes the random-init bias to short commands)."""
    if temperature <= 0:
        raise PolicyError(f"temperature: must be > 0 for a score-mode distribution, got {temperature}")
    if lengths is not None:
        seq_logp = seq_logp / torch.as_tensor(lengths, dtype=seq_logp.dtype, device=seq_logp.device)
    return F.log_softmax(seq_logp / temperature, dim=-1)


def score_sample_logprobs(model, samples: Sequence[ScoreSample], pad_id: int = 0):
    """New log pi(chosen) and the candidate-softmax entropy per sample: tensors (len(samples),), the
    distributions of :func:`candidate_distribution` for all samples at once (rows padded with -inf)."""
    seq = torch.cat(candidate_logprobs(model, [s.prompt_ids for s in samples], [s.candidate_ids for s in samples], pad_id))
    device, counts = seq.device, [len(s.candidate_ids) for s in samples]
    if any(s.temperature <= 0 for s in samples):
        raise PolicyError("temperature: must be > 0 for a score-mode distribution")
    divisor = torch.as_tensor([(len(c) if s.length_norm else 1) * s.temperature for s in samples for c in s.candidate_ids],
                              dtype=seq.dtype, device=device)
    row = torch.repeat_interleave(torch.arange(len(samples), device=device), torch.as_tensor(counts, device=device))
    col = torch.cat([torch.arange(n, device=device) for n in counts])
    scores = torch.full((len(samples), max(counts)), float("-inf"), dtype=seq.dtype, device=device)
    dist = F.log_softmax(scores.index_put((row, col), seq / divisor), dim=-1)
    logps = dist[torch.arange(len(samples), device=device), torch.as_tensor([s.chosen for s in samples], device=device)]
    entropies = -(dist.exp() * dist.masked_fill(dist == float("-inf"), 0.0)).sum(-1)
    return logps, entropies


def generate_sample_logprobs(model, samples: Sequence[GenerateSample], pad_id: int = 0, with_entropy: bool = True):
    """New per-token log-probs (flat), per-token entropy (flat) and the sample index of each token."""
    return token_logprobs(model, [s.prompt_ids for s in samples], [s.response_ids for s in samples],
                          [s.temperature for s in samples], pad_id, with_entropy)
