"""Load any Hugging Face causal LM (name or local folder), optionally wrapped with a LoRA adapter.

The reference policy of the KL term (docs/architecture.md "Policy and loss", verl-agent convention) is the same
model with its adapter disabled (``with model.disable_adapter()``); without LoRA it is a frozen
copy of the weights taken before the first update (:func:`frozen_copy`).
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Sequence

import torch

from .tiny import TINY_MARKER
from milegpo_cli.errors import MilegpoError

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


class PolicyLoadError(MilegpoError, ValueError):
    """A model, tokenizer or adapter could not be loaded as configured."""


def resolve_dtype(name: str | None) -> torch.dtype | str:
    if name in (None, "", "auto"):
        return torch.float32  # CPU default; use "bfloat16" explicitly for large models on GPU
    if name not in DTYPES:
        raise PolicyLoadError(f"policy.dtype: unknown dtype {name!r} (allowed: auto, {', '.join(DTYPES)})")
    return DTYPES[name]


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_tokenizer(name_or_folder: str | Path):
    """Tokenizer of a checkpoint; a pad token is set (eos) when the checkpoint has none."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    folder = Path(name_or_folder)
    try:
        if (folder / TINY_MARKER).exists():  # Qwen2Tokenizer would rewrite our trained ids (stack-facts)
            tok = PreTrainedTokenizerFast.from_pretrained(folder)
        else:
            tok = AutoTokenizer.from_pretrained(str(name_or_folder))
    except OSError as err:
        raise PolicyLoadError(f"policy.model: cannot load a tokenizer from {str(name_or_folder)!r}: {err}") from err
    if tok.pad_token_id is None:
        if tok.eos_token_id is None:
            raise PolicyLoadError(f"policy.model: tokenizer of {str(name_or_folder)!r} has neither pad nor eos token")
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(name_or_folder: str | Path, dtype: str | None = None, device: str | torch.device | None = None):
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(str(name_or_folder), dtype=resolve_dtype(dtype))
    except OSError as err:
        raise PolicyLoadError(f"policy.model: cannot load a causal LM from {str(name_or_folder)!r}: {err}") from err
    return model.to(resolve_device(device))


def add_lora(model, r: int, alpha: float, dropout: float, targets: Sequence[str] | None):
    """Wrap ``model`` with a fresh LoRA adapter (peft); only the adapter is trainable."""
    from peft import LoraConfig, get_peft_model

    if r <= 0:
        raise PolicyLoadError(f"policy.lora_r: must be positive, got {r}")
    config = LoraConfig(r=int(r), lora_alpha=float(alpha), lora_dropout=float(dropout),
                        target_modules=list(targets) if targets else None, task_type="CAUSAL_LM")
    try:
        return get_peft_model(model, config)
    except ValueError as err:
        raise PolicyLoadError(f"policy.lora_targets: {err}") from err


def load_lora(model, adapter_folder: str | Path, trainable: bool = True):
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(adapter_folder), is_trainable=trainable)


def is_peft(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


def frozen_copy(model):
    """An eval-mode copy with ``requires_grad=False`` (reference policy without LoRA)."""
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
