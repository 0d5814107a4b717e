"""The split forward of a Qwen2 / Llama decoder for candidate scoring (docs/performance.md): the
prompt region runs causally without a mask, the candidate region under its own block mask, and the
last layer only where a candidate token is predicted; equal to the block-masked full forward of
:func:`milegpo_cli.policy.actions.pack_candidates` at those positions (tests/test_policy.py)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F


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


