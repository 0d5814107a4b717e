"""The default model for machines without a GPU or hub access (docs/architecture.md, "Policy and loss").

A small Qwen2-architecture causal LM built from a config dict, with a byte-level BPE tokenizer
trained locally (``tokenizers``) on the environment's own text plus the prompt template. Both are
saved with ``save_pretrained`` into ``<cache_dir>/<hash of config + corpus>/`` and from then on
loaded like any Hugging Face checkpoint folder (policy/hf.py).

Tokenizer pitfall (notes/stack-facts.md): with a Qwen2 model config, ``AutoTokenizer`` would pick
``Qwen2Tokenizer`` and change the ids; the saved ``tokenizer_config.json`` therefore names
``PreTrainedTokenizerFast`` explicitly, and hf.load_tokenizer honours it.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable

import torch

from milegpo_cli.errors import MilegpoError

EOS_TOKEN = "<|endoftext|>"
TINY_MARKER = "milegpo_tiny.json"  # written next to the weights; records the build config

DEFAULTS: dict[str, int] = {
    "hidden_size": 64,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 512,
}


class TinyModelError(MilegpoError, ValueError):
    """Bad tiny-model config or corpus."""


def tiny_config(cfg: Any) -> dict[str, int]:
    """Resolve a tiny config (dict or object with the DEFAULTS fields) to a validated dict."""
    out = dict(DEFAULTS)
    for key in DEFAULTS:
        value = cfg.get(key) if isinstance(cfg, dict) else getattr(cfg, key, None)
        if value is not None:
            out[key] = int(value)
    for key, value in out.items():
        if value <= 0:
            raise TinyModelError(f"tiny.{key}: must be a positive integer, got {value}")
    if out["hidden_size"] % out["num_heads"]:
        raise TinyModelError(f"tiny.hidden_size: {out['hidden_size']} is not divisible by num_heads={out['num_heads']}")
    if out["num_heads"] % out["num_kv_heads"]:
        raise TinyModelError(f"tiny.num_kv_heads: {out['num_kv_heads']} does not divide num_heads={out['num_heads']}")
    if out["vocab_size"] < 260:
        raise TinyModelError(f"tiny.vocab_size: must be >= 260 (256 bytes + specials), got {out['vocab_size']}")
    return out


def train_tokenizer(sentences: list[str], vocab_size: int):
    """Byte-level BPE trained on ``sentences``; every byte is in the alphabet, so any text encodes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(sentences, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN)


def build_model(cfg: dict[str, int], vocab_size: int, eos_id: int, seed: int = 0):
    """A freshly initialised Qwen2ForCausalLM (deterministic in ``seed``, global RNG untouched)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_layers"],
        num_attention_heads=cfg["num_heads"],
        num_key_value_heads=cfg["num_kv_heads"],
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(config)


def corpus_hash(cfg: dict[str, int], sentences: list[str]) -> str:
    h = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode())
    for s in sentences:
        h.update(s.encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


def ensure_tiny_model(cfg: Any, corpus: Iterable[str], cache_dir: str | Path) -> Path:
    """Build (or find in the cache) the tiny model + tokenizer for ``cfg`` and ``corpus``; return its folder."""
    resolved = tiny_config(cfg)
    sentences = [s for s in corpus if s and s.strip()]
    if not sentences:
        raise TinyModelError("tiny model: the tokenizer corpus is empty")
    folder = Path(cache_dir) / corpus_hash(resolved, sentences)
    if (folder / TINY_MARKER).exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    # One builder at a time (e.g. `milegpo ablate --parallel 2`, the ranks of `accelerate launch`);
    # the others wait and then find it built. The build goes to a private temporary folder renamed
    # into place, so an interrupted build never leaves a folder with the marker.
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / TINY_MARKER).exists():
            return folder
        tokenizer = train_tokenizer(sentences, resolved["vocab_size"])
        model = build_model(resolved, len(tokenizer), tokenizer.eos_token_id)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            (tmp / TINY_MARKER).write_text(json.dumps({"tiny": resolved, "sentences": len(sentences)}, indent=1))
            shutil.rmtree(folder, ignore_errors=True)  # an interrupted earlier build
            os.rename(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder
