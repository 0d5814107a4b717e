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
log-probs are those of the sampling distribution); the action is parsed from <action>...</action>
(fallback: the last non-empty line) and projected onto the admissible commands (exact match, else
case/whitespace-normalised match, else invalid -> ``None``). Per-token log-probs under
softmax(logits / T) are recorded for the loss on the generated tokens.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from typing import Sequence

import torch
import torch.nn.functional as F

from milegpo_cli.errors import MilegpoError


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
    pass over the packed rows of :func:`pack_candidates` (block attention mask). Returns one tensor
    (len(candidates[b]),) per prompt. Gradients flow when enabled."""
    if len(prompts) != len(candidates):
        raise PolicyError(f"candidate_logprobs: {len(prompts)} prompts but {len(candidates)} candidate lists")
    if any(len(p) == 0 for p in prompts) or any(len(cs) == 0 for cs in candidates):
        raise PolicyError("candidate_logprobs: empty prompt or empty candidate list")
    device = model_device(model)
    ids, pos, mask, row, src, tgt = pack_candidates(prompts, candidates, pad_id, device)
    dtype = next(model.parameters()).dtype
    bias = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(~mask, torch.finfo(dtype).min)
    decoder = model.get_decoder()
    if TAIL_LAST_LAYER and tail_layer_supported(decoder):
        # the last layer only where a candidate token is predicted: the tail of each row
        first = torch.as_tensor([len(p) - 1 for p in prompts], device=device)
        hidden = tail_forward(decoder, ids, pos, bias, first, max(sum(len(c) for c in cs) for cs in candidates) + 1)
        logits = model.get_output_embeddings()(hidden[row, src - first[row]])
    else:  # the output head only where a candidate token is predicted (not on prompt and padding positions)
        hidden = decoder(input_ids=ids, attention_mask=bias, position_ids=pos, use_cache=False).last_hidden_state
        logits = model.get_output_embeddings()(hidden[row, src])
    tok_logp = F.log_softmax(logits.float(), dim=-1).gather(-1, ids[row, tgt][:, None]).squeeze(-1)
    lengths = [len(c) for cs in candidates for c in cs]
    cand = torch.repeat_interleave(torch.arange(len(lengths), device=device), torch.as_tensor(lengths, device=device))
    seq_logp = torch.zeros(len(lengths), dtype=tok_logp.dtype, device=device).index_add(0, cand, tok_logp)
    return list(seq_logp.split([len(cs) for cs in candidates]))


TAIL_LAST_LAYER = True  # False: the last layer over whole rows (bench/train_speed.py's baseline)
_TAIL_MODELS = ("qwen2", "llama")  # decoders whose layers :func:`tail_forward` reproduces


def tail_layer_supported(decoder) -> bool:
    cfg = getattr(decoder, "config", None)
    return (getattr(cfg, "model_type", None) in _TAIL_MODELS and not getattr(cfg, "use_sliding_window", False)
            and all(hasattr(decoder, a) for a in ("embed_tokens", "rotary_emb", "layers", "norm")))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def tail_forward(decoder, ids: torch.Tensor, pos: torch.Tensor, bias: torch.Tensor, first: torch.Tensor,
                 width: int) -> torch.Tensor:
    """Final hidden states (B, width, D) of positions first[b] .. first[b] + width - 1 of each row: every
    layer but the last over whole rows, the last one with queries at those positions only (keys and
    values over the whole row), as Qwen2/Llama decoder layers compute them (pre-norm, rotary
    q/k, grouped-query attention, residual, MLP). Position outputs of the last layer depend only on
    their own query, so the result equals the full forward's at those positions."""
    h = decoder.embed_tokens(ids)
    cos, sin = decoder.rotary_emb(h, pos)
    for layer in decoder.layers[:-1]:
        out = layer(h, attention_mask=bias, position_ids=pos, position_embeddings=(cos, sin))
        h = out[0] if isinstance(out, tuple) else out
    layer = decoder.layers[-1]
    attn = layer.self_attn
    B, T, _ = h.shape
    tail = (first[:, None] + torch.arange(width, device=h.device)[None, :]).clamp(max=T - 1)  # (B, Q)

    def pick(x: torch.Tensor) -> torch.Tensor:  # (B, T, C) -> (B, Q, C) at the tail positions
        return x.gather(1, tail[:, :, None].expand(-1, -1, x.shape[-1]))

    x = layer.input_layernorm(h)
    hd = attn.head_dim
    k = attn.k_proj(x).view(B, T, -1, hd).transpose(1, 2)
    v = attn.v_proj(x).view(B, T, -1, hd).transpose(1, 2)
    q = attn.q_proj(pick(x)).view(B, width, -1, hd).transpose(1, 2)
    cq, sq = pick(cos)[:, None], pick(sin)[:, None]
    q = q * cq + _rotate_half(q) * sq
    k = k * cos[:, None] + _rotate_half(k) * sin[:, None]
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    mask = bias.gather(2, tail[:, None, :, None].expand(-1, bias.shape[1], -1, T))
    drop = float(getattr(attn, "attention_dropout", 0.0)) if attn.training else 0.0
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop,
                                       scale=getattr(attn, "scaling", hd ** -0.5))
    h = pick(h) + attn.o_proj(o.transpose(1, 2).reshape(B, width, -1))
    h = h + layer.mlp(layer.post_attention_layernorm(h))
    return decoder.norm(h)


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
    """New log pi(chosen) and the candidate-softmax entropy per sample: tensors (len(samples),)."""
    seq = candidate_logprobs(model, [s.prompt_ids for s in samples], [s.candidate_ids for s in samples], pad_id)
    logps, entropies = [], []
    for s, lp in zip(samples, seq):
        dist = candidate_distribution(lp, s.temperature, [len(c) for c in s.candidate_ids] if s.length_norm else None)
        logps.append(dist[s.chosen])
        entropies.append(-(dist.exp() * dist).sum())
    return torch.stack(logps), torch.stack(entropies)


def generate_sample_logprobs(model, samples: Sequence[GenerateSample], pad_id: int = 0, with_entropy: bool = True):
    """New per-token log-probs (flat), per-token entropy (flat) and the sample index of each token."""
    return token_logprobs(model, [s.prompt_ids for s in samples], [s.response_ids for s in samples],
                          [s.temperature for s in samples], pad_id, with_entropy)


# --- generate mode: sampling, parsing, projection -------------------------------------------------

ACTION_RE = re.compile(r"<action>(.*?)</action>", re.IGNORECASE | re.DOTALL)
THINK_RE = re.compile(r"<think>.*?(</think>|$)", re.IGNORECASE | re.DOTALL)


def parse_action(reply: str) -> str | None:
    """The text of the last <action>...</action>; else after an unclosed <action>; else the last
    non-empty line outside <think>...</think>. None for an empty reply."""
    found = ACTION_RE.findall(reply)
    if found:
        return found[-1].strip()
    lower = reply.lower()
    if "<action>" in lower:
        return reply[lower.rindex("<action>") + len("<action>"):].strip() or None
    lines = [ln.strip() for ln in THINK_RE.sub("", reply).splitlines() if ln.strip()]
    return lines[-1] if lines else None


def normalise(text: str) -> str:
    return " ".join(text.lower().split()).strip(" .!'\"")


def project_action(text: str | None, admissible: Sequence[str]) -> str | None:
    """Exact match, else case/whitespace-normalised match, else None (invalid)."""
    if not text:
        return None
    if text in admissible:
        return text
    by_norm = {normalise(a): a for a in admissible}
    return by_norm.get(normalise(text))


@torch.no_grad()
def sample_replies(model, prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float,
                   greedy: bool, pad_id: int, eos_id: int) -> list[tuple[list[int], list[float]]]:
    """Sample one reply per prompt; returns (response ids up to and including eos, token log-probs
    under softmax(logits / T), T = 1 when greedy)."""
    from transformers import GenerationConfig

    device = model_device(model)
    ids, mask = pad(prompts, pad_id, left=True, device=device)
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=not greedy, temperature=temperature if not greedy else 1.0,
        top_k=0, top_p=1.0, repetition_penalty=1.0, pad_token_id=pad_id, eos_token_id=eos_id,
        return_dict_in_generate=True, output_logits=True,
    )
    out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    new = out.sequences[:, ids.shape[1]:]
    temp = 1.0 if greedy else temperature
    logp = torch.stack([F.log_softmax(lg.float() / temp, dim=-1) for lg in out.logits], dim=1)  # (B, L, V)
    tok_logp = logp.gather(-1, new[:, :, None]).squeeze(-1)
    replies = []
    for row, lp in zip(new.tolist(), tok_logp.tolist()):
        n = row.index(eos_id) + 1 if eos_id in row else len(row)
        replies.append((row[:n], lp[:n]))
    return replies
