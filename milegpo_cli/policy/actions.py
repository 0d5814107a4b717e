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

import numpy as np
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


@dataclass
class SplitRows:
    """Prompts and candidates laid out for :func:`split_forward`: per row the prompt, right-padded to
    the widest prompt P, then its candidates back to back, right-padded to the widest C."""

    ids: torch.Tensor  # (B, P + C)
    pos: torch.Tensor  # (B, P + C) position ids: 0.. over the prompt, restarting after it for every candidate
    prompt_width: int  # P
    cand_bias: torch.Tensor  # (B, 1, C, P + C) additive mask of the candidate-region queries
    tail: torch.Tensor  # (B, 1 + C) the last layer's query positions: the last prompt token, the candidate region
    tail_bias: torch.Tensor  # (B, 1, 1 + C, P + C) additive mask of those queries
    row: torch.Tensor  # per candidate token (flat, in order): its row ...
    src: torch.Tensor  # ... and the index in ``tail`` whose output predicts it
    target: torch.Tensor  # its token id


def pack_split(prompts: Sequence[Sequence[int]], candidates: Sequence[Sequence[Sequence[int]]], pad_id: int,
               device, dtype: torch.dtype) -> SplitRows:
    """The :class:`SplitRows` of ``prompts`` and their ``candidates``. A candidate token sees its
    prompt (keys before the prompt's length) and its own earlier tokens; a padding query of the
    candidate region sees the prompt and earlier padding (finite, unread)."""
    B = len(prompts)
    flat = [[t for c in cs for t in c] for cs in candidates]
    lp, lc = np.array([len(p) for p in prompts]), np.array([len(f) for f in flat])
    P, C = int(lp.max()), int(lc.max())
    ids = np.full((B, P + C), pad_id, dtype=np.int64)
    pos = np.zeros((B, P + C), dtype=np.int64)
    cand = np.zeros((B, C), dtype=np.int64)  # candidate number (1..K) of each candidate-region token, 0: padding
    src = []
    for b, (p, cs) in enumerate(zip(prompts, candidates)):
        lens = np.array([len(c) for c in cs])
        within = np.arange(lc[b]) - np.repeat(np.cumsum(lens) - lens, lens)  # index of a token in its candidate
        ids[b, :lp[b]], ids[b, P:P + lc[b]] = p, flat[b]
        pos[b, :lp[b]], pos[b, P:P + lc[b]] = np.arange(lp[b]), lp[b] + within
        cand[b, :lc[b]] = np.repeat(np.arange(1, len(cs) + 1), lens)
        src.append(np.where(within == 0, 0, np.arange(lc[b])))  # tail index 0: the last prompt token; t: token t - 1
    sees_prompt = torch.arange(P)[None, :] < torch.as_tensor(lp)[:, None]  # (B, P)
    cand_t = torch.as_tensor(cand)
    own = (cand_t[:, :, None] == cand_t[:, None, :]) & torch.ones((C, C), dtype=torch.bool).tril()
    sees = torch.cat([sees_prompt[:, None, :].expand(B, C, P), own], dim=-1)
    sees_tail = torch.cat([torch.cat([sees_prompt, torch.zeros((B, C), dtype=torch.bool)], -1)[:, None], sees], dim=1)

    def bias(allowed: torch.Tensor) -> torch.Tensor:
        return torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)[:, None].to(device)

    as_t = partial(torch.as_tensor, dtype=torch.long, device=device)
    tail = np.concatenate([lp[:, None] - 1, P + np.broadcast_to(np.arange(C), (B, C))], axis=1)
    return SplitRows(ids=as_t(ids), pos=as_t(pos), prompt_width=P, cand_bias=bias(sees), tail=as_t(tail),
                     tail_bias=bias(sees_tail), row=as_t(np.repeat(np.arange(B), lc)), src=as_t(np.concatenate(src)),
                     target=as_t([t for f in flat for t in f]))


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


SPLIT_FORWARD = True  # False: one block-masked pass over whole rows (bench/train_speed.py's baseline)
_SPLIT_MODELS = ("qwen2", "llama")  # decoders whose layers :func:`split_forward` reproduces
_SDPA_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)  # scaled_dot_product_attention(enable_gqa=)


def split_forward_supported(decoder) -> bool:
    cfg = getattr(decoder, "config", None)
    return (getattr(cfg, "model_type", None) in _SPLIT_MODELS and not getattr(cfg, "use_sliding_window", False)
            and all(hasattr(decoder, a) for a in ("embed_tokens", "rotary_emb", "layers", "norm")))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos[:, None] + _rotate_half(x) * sin[:, None]


def _pick(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(B, T, C) -> (B, Q, C) at positions ``index`` (B, Q)."""
    return x.gather(1, index[:, :, None].expand(-1, -1, x.shape[-1]))


def _split_layer(layer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rows: SplitRows, last: bool) -> torch.Tensor:
    """One Qwen2/Llama decoder layer (pre-norm, rotary q/k, grouped-query attention, residual, MLP)
    with the attention split in two: the prompt region causally (``is_causal``: no mask, the keys
    after each query skipped), the candidate region against the whole row under ``cand_bias``. The
    last layer computes queries, attention and MLP at ``rows.tail`` only."""
    attn = layer.self_attn
    B, T, _ = h.shape
    hd = attn.head_dim
    x = layer.input_layernorm(h)
    k = _rope(attn.k_proj(x).view(B, T, -1, hd).transpose(1, 2), cos, sin)
    v = attn.v_proj(x).view(B, T, -1, hd).transpose(1, 2)
    if last:  # position outputs of the last layer depend only on their own query
        x, h, cos, sin = (_pick(t, rows.tail) for t in (x, h, cos, sin))
    q = _rope(attn.q_proj(x).view(B, x.shape[1], -1, hd).transpose(1, 2), cos, sin)
    gqa = {}
    if q.shape[1] != k.shape[1]:  # grouped-query attention: each key/value head serves q / kv query heads
        if _SDPA_GQA:
            gqa = {"enable_gqa": True}
        else:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    sdpa = partial(F.scaled_dot_product_attention, dropout_p=float(getattr(attn, "attention_dropout", 0.0)) if attn.training
                   else 0.0, scale=getattr(attn, "scaling", hd ** -0.5), **gqa)
    if last:
        o = sdpa(q, k, v, attn_mask=rows.tail_bias)
    else:
        P = rows.prompt_width
        o = torch.cat([sdpa(q[:, :, :P], k[:, :, :P], v[:, :, :P], is_causal=True),
                       sdpa(q[:, :, P:], k, v, attn_mask=rows.cand_bias)], dim=2)
    h = h + attn.o_proj(o.transpose(1, 2).reshape(B, q.shape[2], -1))
    return h + layer.mlp(layer.post_attention_layernorm(h))


def split_forward(decoder, rows: SplitRows) -> torch.Tensor:
    """Final hidden states (B, 1 + C, D) at ``rows.tail`` (each row's last prompt token, then its
    candidate region), equal to the block-masked full forward's at those positions: a prompt token
    sees only earlier prompt tokens (right padding comes after it), so the prompt region needs no
    mask, and the last layer is needed only where a candidate token is predicted."""
    h = decoder.embed_tokens(rows.ids)
    cos, sin = decoder.rotary_emb(h, rows.pos)
    for i, layer in enumerate(decoder.layers):
        h = _split_layer(layer, h, cos, sin, rows, last=i == len(decoder.layers) - 1)
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
