"""``milegpo train --dry-run``: the resolved plan of a recipe, without loading any weights.

Parameter count: the model is instantiated from its config on PyTorch's ``meta`` device (shapes
only, no memory), so the count is exact whenever the config is at hand: ``tiny`` (the recipe's tiny
config; the vocabulary is the configured maximum, the trained tokenizer may stay below it), a local
folder (its config.json), a hub name already in the local Hugging Face cache. A hub name that is not
cached is looked up in :data:`KNOWN_ARCHITECTURES` (the published configs of a few models) and the
plan says so; otherwise the count is unknown. LoRA adds r x (in + out) per targeted linear layer.

Memory per GPU is an estimate for data parallel (every process holds the whole model; FSDP would
shard the first three terms), in bytes:
- weights: P x size(policy.dtype); the KL reference: 0 with LoRA (adapter disabled), else a frozen
  copy (P x size) when ``ppo.kl_coef`` > 0;
- training state: T trainable parameters x (weight + gradient + AdamW's two moments), each of the
  trainable weights' dtype (peft keeps LoRA adapters in float32; full fine-tuning: policy.dtype);
- update activations of one micro-batch: tokens x (34 x hidden x layers x size / 2) (a transformer
  layer without recomputation, Korthikanti et al. 2022, attention scores not stored) plus the logits
  tokens x vocab x (size + 8) (the float32 copy and its log-softmax);
- rollout KV cache: G x N sequences x tokens x 2 x layers x kv_heads x head_dim x size;
peak = weights + reference + training state + max(activations, KV cache). Token counts are upper
bounds: every step at max_prompt_tokens + max_new_tokens (score mode: + 16 candidates x 8 tokens).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from milegpo_cli.config import Config

DTYPE_BYTES = {"auto": 4, "float32": 4, "bfloat16": 2, "float16": 2}
SCORE_CANDIDATE_TOKENS = 16 * 8  # score mode: ~16 admissible commands of ~8 tokens each (an assumption)

_QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
          "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 32768}
_SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "vocab_size", "tie_word_embeddings")
_QWEN25_SHAPES = {  # from the models' published config.json, in the order of _SHAPE_KEYS
    "Qwen/Qwen2.5-0.5B-Instruct": (896, 4864, 24, 14, 2, 151936, True),
    "Qwen/Qwen2.5-1.5B-Instruct": (1536, 8960, 28, 12, 2, 151936, True),
    "Qwen/Qwen2.5-3B-Instruct": (2048, 11008, 36, 16, 2, 151936, True),
    "Qwen/Qwen2.5-7B-Instruct": (3584, 18944, 28, 28, 4, 152064, False),
}
KNOWN_ARCHITECTURES: dict[str, dict] = {name: {**_QWEN2, **dict(zip(_SHAPE_KEYS, shape))}
                                        for name, shape in _QWEN25_SHAPES.items()}
for _name in list(KNOWN_ARCHITECTURES):  # the base models share the instruct models' shapes
    KNOWN_ARCHITECTURES[_name.removesuffix("-Instruct")] = KNOWN_ARCHITECTURES[_name]


@dataclass
class Plan:
    model: str
    source: str  # where the architecture came from
    exact: bool  # False: a table entry, not the checkpoint's own config
    parameters: int | None
    trainable: int | None
    memory: dict[str, float] = field(default_factory=dict)  # GiB per GPU, by part
    batch: dict[str, int | str] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return self.__dict__.copy()


def model_config(config: Config):
    """(transformers config, source, exact) of the recipe's model, or (None, reason, False)."""
    from transformers import AutoConfig, Qwen2Config

    from milegpo_cli.policy.tiny import tiny_config

    name = config.policy.model
    if name == "tiny":
        cfg = tiny_config(config.policy.tiny)
        return build_model_config(cfg), "the recipe's [policy.tiny] config", True
    if Path(name).is_dir():
        if not (Path(name) / "config.json").is_file():
            return None, f"{name}: no config.json in the folder", False
        return AutoConfig.from_pretrained(name), f"{Path(name) / 'config.json'}", True
    try:
        return AutoConfig.from_pretrained(name, local_files_only=True), "the local Hugging Face cache", True
    except (OSError, ValueError):
        pass
    if name in KNOWN_ARCHITECTURES:
        values = dict(KNOWN_ARCHITECTURES[name])
        values.pop("architectures"), values.pop("model_type")
        return Qwen2Config(**values), "milegpo's table of published configs (not cached here)", False
    return None, "not cached here and not in the table of known architectures", False


def build_model_config(tiny: dict[str, int]):
    """The transformers config of the tiny model (policy/tiny.py), with its maximum vocabulary."""
    from milegpo_cli.policy.tiny import build_model

    with _meta():
        return build_model(tiny, tiny["vocab_size"], 0).config


def _meta():
    import torch

    return torch.device("meta")


def count_parameters(hf_config, lora_targets: tuple[str, ...] | None, lora_r: int | None) -> tuple[int, int]:
    """(total, trainable) parameters of the model built on the meta device; trainable = LoRA's
    r x (in + out) per targeted linear layer, or every parameter without LoRA."""
    import torch
    from transformers import AutoModelForCausalLM

    with _meta():
        model = AutoModelForCausalLM.from_config(hf_config)
    total = sum(p.numel() for p in model.parameters())
    if lora_r is None:
        return total, total
    trainable = sum(lora_r * (m.in_features + m.out_features) for name, m in model.named_modules()
                    if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in set(lora_targets or ()))
    return total, trainable


def make_plan(config: Config, world_size: int | None = None) -> Plan:
    """The plan of ``config`` per process (``world_size``: processes under ``accelerate launch``,
    default the WORLD_SIZE of the environment, else 1)."""
    world = world_size or int(os.environ.get("WORLD_SIZE", "1"))
    pol, ro, ppo = config.policy, config.rollout, config.ppo
    hf_config, source, exact = model_config(config)
    per_step = pol.max_prompt_tokens + (pol.max_new_tokens if pol.action_mode == "generate" else SCORE_CANDIDATE_TOKENS)
    episodes = ro.groups * ro.group_size
    steps = episodes * config.env.max_steps
    micro = ppo.micro_batch_size or ppo.minibatch_size
    plan = Plan(model=pol.model, source=source, exact=exact, parameters=None, trainable=None,
                batch={"groups_per_process": ro.groups, "group_size": ro.group_size, "processes": world,
                       "episodes_per_iteration": episodes * world, "max_steps": config.env.max_steps,
                       "steps_per_iteration_max": steps * world, "ppo_minibatch": ppo.minibatch_size,
                       "ppo_micro_batch": micro, "ppo_epochs": ppo.epochs,
                       "optimizer_steps_per_iteration_max": ppo.epochs * math.ceil(steps / ppo.minibatch_size),
                       "action_mode": pol.action_mode, "lora": f"r={pol.lora_r} on {','.join(pol.lora_targets)}"
                       if pol.lora else "off", "dtype": pol.dtype, "mixed_precision": config.run.mixed_precision},
                tokens={"per_step_max": per_step, "per_iteration_max": per_step * steps * world,
                        "generated_per_iteration_max": pol.max_new_tokens * steps * world
                        if pol.action_mode == "generate" else 0})
    if hf_config is None:
        return plan
    total, trainable = count_parameters(hf_config, pol.lora_targets, pol.lora_r if pol.lora else None)
    plan.parameters, plan.trainable = total, trainable
    size = DTYPE_BYTES[pol.dtype]
    train_size = 4 if pol.lora else size
    h, layers = hf_config.hidden_size, hf_config.num_hidden_layers
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or h // hf_config.num_attention_heads
    micro_tokens = min(micro, steps) * per_step
    gib = 2.0 ** 30
    activations = micro_tokens * (34 * h * layers * size / 2 + hf_config.vocab_size * (size + 8))
    kv_cache = episodes * per_step * 2 * layers * kv_heads * head_dim * size
    plan.memory = {
        "weights": total * size / gib,
        "reference": 0.0 if pol.lora or ppo.kl_coef == 0 else total * size / gib,
        "training_state": trainable * 4 * train_size / gib,
        "update_activations": activations / gib,
        "rollout_kv_cache": kv_cache / gib,
    }
    plan.memory["peak"] = (plan.memory["weights"] + plan.memory["reference"] + plan.memory["training_state"]
                           + max(plan.memory["update_activations"], plan.memory["rollout_kv_cache"]))
    return plan


def format_plan(plan: Plan) -> str:
    """The plan as plain text lines."""
    note = "" if plan.exact else "  (ESTIMATE: architecture from a table, not the checkpoint)"
    lines = [f"model: {plan.model}", f"architecture from: {plan.source}{note}"]
    if plan.parameters is None:
        lines.append("parameters: unknown (memory not estimated)")
    else:
        lines.append(f"parameters: {plan.parameters:,} ({plan.parameters / 1e9:.3f} B), trainable {plan.trainable:,}")
        lines.append("memory per GPU (estimate, GiB): " + ", ".join(f"{k} {v:.2f}" for k, v in plan.memory.items()))
    lines.append("batch: " + ", ".join(f"{k} {v}" for k, v in plan.batch.items()))
    lines.append("tokens (upper bounds): " + ", ".join(f"{k} {v:,}" for k, v in plan.tokens.items()))
    return "\n".join(lines)


def describe(config: Config) -> str:
    """``milegpo train --dry-run``: the plan of ``config`` as text."""
    return format_plan(make_plan(config))
