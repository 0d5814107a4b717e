"""Generate mode (docs/architecture.md, "Policy and loss"): sample a reply, parse the action from it
(<action>...</action>, else the last non-empty line) and project it onto the admissible commands."""
from __future__ import annotations

import re
from typing import Sequence

import torch
import torch.nn.functional as F

from .actions import model_device, pad


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
