"""The agent's policy: a causal LM (+ optional LoRA), its tokenizer, prompts and action mode.

``Policy.act`` maps a batch of observations (the envs of a group) to actions, with one batched
forward pass per call; the returned ``ActionSample.sample`` carries what the PPO update needs to
recompute the action's log-prob (trainer/ppo.py).
"""
from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from . import hf
from .actions import (ActionSample, GenerateSample, PolicyError, ScoreSample, candidate_distribution,
                      candidate_logprobs)
from .prompts import encode_prompt, template_corpus
from .replies import parse_action, project_action, sample_replies
from .tiny import TINY_MARKER, ensure_tiny_model

MODES = ("score", "generate")
SCORE_NORMS = ("sum", "mean")
FORMAT = 1


def cfg_get(cfg: Any, key: str, default: Any = None) -> Any:
    value = cfg.get(key, default) if isinstance(cfg, dict) else getattr(cfg, key, default)
    return default if value is None else value


def with_lora(model, cfg: Any):
    """``model`` under a fresh LoRA adapter when ``cfg.lora`` (peft; only the adapter trains), else as is."""
    if not cfg_get(cfg, "lora", False):
        return model
    return hf.add_lora(model, cfg_get(cfg, "lora_r", 8), cfg_get(cfg, "lora_alpha", 16),
                       cfg_get(cfg, "lora_dropout", 0.0), cfg_get(cfg, "lora_targets"))


class Policy:
    def __init__(self, model, tokenizer, cfg: Any, base: str, tiny: bool = False, ref_model=None):
        mode = cfg_get(cfg, "action_mode", "score")
        if mode not in MODES:
            raise PolicyError(f"policy.action_mode: unknown mode {mode!r} (allowed: {', '.join(MODES)})")
        self.model, self.tokenizer, self.cfg, self.ref_model = model, tokenizer, cfg, ref_model
        self.base, self.tiny = base, tiny  # base model name/folder; tiny: built locally (policy/tiny.py)
        self.action_mode: str = mode
        self.history: int = int(cfg_get(cfg, "history", 2))
        self.max_prompt_tokens: int = int(cfg_get(cfg, "max_prompt_tokens", 512))
        self.max_new_tokens: int = int(cfg_get(cfg, "max_new_tokens", 64))
        self.temperature: float = float(cfg_get(cfg, "temperature", 1.0))
        norm = cfg_get(cfg, "score_norm", "sum")
        if norm not in SCORE_NORMS:
            raise PolicyError(f"policy.score_norm: unknown value {norm!r} (allowed: {', '.join(SCORE_NORMS)})")
        self.length_norm: bool = norm == "mean"
        self.pad_id: int = tokenizer.pad_token_id
        self.eos_id: int = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.pad_token_id
        self._candidate_cache: dict[str, list[int]] = {}

    # --- construction -----------------------------------------------------------------------
    @classmethod
    def from_config(cls, policy_cfg: Any, corpus: Iterable[str] | None = None,
                    cache_dir: str | Path = "runs/models", device: str | torch.device | None = None) -> "Policy":
        """``model = "tiny"`` builds (or reuses from ``cache_dir``) the local tiny model, whose tokenizer
        is trained on ``corpus`` + the prompt templates; anything else is a HF name or folder."""
        name = str(cfg_get(policy_cfg, "model", "tiny"))
        tiny = name == "tiny"
        if tiny:
            if corpus is None:
                raise PolicyError("policy.model = 'tiny' needs the environment's text corpus to train its tokenizer")
            name = str(ensure_tiny_model(cfg_get(policy_cfg, "tiny", {}), [*corpus, *template_corpus()], cache_dir))
        model = hf.load_causal_lm(name, cfg_get(policy_cfg, "dtype"), device)
        tokenizer = hf.load_tokenizer(name)
        return cls(with_lora(model, policy_cfg), tokenizer, policy_cfg, name, tiny)

    @classmethod
    def start_from(cls, folder: str | Path, policy_cfg: Any, device: str | torch.device | None = None) -> "Policy":
        """A saved full-model policy (e.g. the cached base policy) as the start of training: its weights
        are the base model, under a fresh LoRA adapter when ``policy.lora`` (so the adapter-disabled
        reference of the KL term is this policy, not the model before it was trained)."""
        folder = Path(folder)
        meta = json.loads((folder / "policy.json").read_text())
        if meta["lora"]:
            raise PolicyError(f"{folder}: a LoRA checkpoint cannot be a starting policy (merge it first)")
        model = with_lora(hf.load_causal_lm(folder / "model", cfg_get(policy_cfg, "dtype"), device), policy_cfg)
        return cls(model, hf.load_tokenizer(folder / "tokenizer"), policy_cfg, str(folder / "model"), meta["tiny"])

    def rebase(self, folder: str | Path) -> None:
        """Make the current weights the reference of the KL term: with LoRA, merge the adapter into the
        base weights, save them to ``folder`` (the new base) and add a fresh adapter; without LoRA,
        drop any frozen copy so that ``ensure_reference`` copies the current weights."""
        if not hf.is_peft(self.model):
            self.ref_model = None
            return
        merged = self.model.merge_and_unload()
        merged.save_pretrained(folder)
        self.model, self.base = with_lora(merged, self.cfg), str(folder)

    def ensure_reference(self) -> None:
        """Make a reference policy available for the KL term: LoRA -> adapter disabled (nothing to
        do); full fine-tuning -> a frozen copy of the current weights (call before the first update)."""
        if not hf.is_peft(self.model) and self.ref_model is None:
            self.ref_model = hf.frozen_copy(self.model)

    @contextmanager
    def reference(self):
        """Yields the reference model (same module with adapter disabled, or the frozen copy)."""
        if hf.is_peft(self.model):
            with self.model.disable_adapter():
                yield self.model
        elif self.ref_model is not None:
            yield self.ref_model
        else:
            raise PolicyError("no reference policy: enable LoRA or call ensure_reference() before updating")

    # --- acting -----------------------------------------------------------------------------
    def encode(self, observation, history: Sequence[tuple[str, str]], steps_taken: int) -> list[int]:
        return encode_prompt(self.tokenizer, self.action_mode, observation.task, observation.text,
                             observation.admissible, history, steps_taken, self.history, self.max_prompt_tokens)

    def candidate_ids(self, command: str) -> list[int]:
        """Tokens of a command as a continuation of the prompt (leading space, eos appended)."""
        if command not in self._candidate_cache:
            ids = self.tokenizer(" " + command, add_special_tokens=False).input_ids
            self._candidate_cache[command] = ids + [self.eos_id]
        return self._candidate_cache[command]

    def make_sample(self, observation, history: Sequence[tuple[str, str]], steps_taken: int,
                    action: str) -> ScoreSample | GenerateSample:
        """A training sample that takes ``action`` (e.g. the expert's) in this state, for the warm start.
        Score mode: the action must be admissible; generate mode: the reply "<action>action</action>"."""
        prompt = self.encode(observation, history, steps_taken)
        if self.action_mode == "score":
            if action not in observation.admissible:
                raise PolicyError(f"make_sample: action {action!r} is not admissible in state {observation.state_key!r}")
            cands = [self.candidate_ids(a) for a in observation.admissible]
            return ScoreSample(prompt, cands, observation.admissible.index(action), self.temperature, 0.0,
                               self.length_norm)
        reply = self.tokenizer(f"<action>{action}</action>", add_special_tokens=False).input_ids + [self.eos_id]
        return GenerateSample(prompt, reply, 1.0, [0.0] * len(reply))

    def act(self, observations: Sequence, histories: Sequence[Sequence[tuple[str, str]]],
            steps_taken: Sequence[int], greedy: bool = False, temperature: float | None = None) -> list[ActionSample]:
        if not (len(observations) == len(histories) == len(steps_taken)):
            raise PolicyError(f"act: {len(observations)} observations, {len(histories)} histories, "
                              f"{len(steps_taken)} step counts")
        if not observations:
            return []
        temp = self.temperature if temperature is None else float(temperature)
        if temp <= 0:
            greedy, temp = True, 1.0
        prompts = [self.encode(o, h, k) for o, h, k in zip(observations, histories, steps_taken)]
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                if self.action_mode == "score":
                    return self._act_score(observations, prompts, greedy, temp)
                return self._act_generate(observations, prompts, greedy, temp)
        finally:
            self.model.train(was_training)

    def _act_score(self, observations, prompts, greedy: bool, temp: float) -> list[ActionSample]:
        for o in observations:
            if not o.admissible:
                raise PolicyError(f"act: observation of state {o.state_key!r} has no admissible actions")
        cands = [[self.candidate_ids(a) for a in o.admissible] for o in observations]
        # rollouts of a group often share a state and its history (always at the first step): score
        # each distinct prompt once; every rollout still draws its own action
        keys = [(tuple(p), o.admissible) for o, p in zip(observations, prompts)]
        first: dict = {}
        for i, key in enumerate(keys):
            first.setdefault(key, i)
        rows = list(first.values())
        scored = dict(zip(first, candidate_logprobs(self.model, [prompts[i] for i in rows], [cands[i] for i in rows],
                                                    self.pad_id)))
        out = []
        for o, p, c, key in zip(observations, prompts, cands, keys):
            seq = scored[key]
            dist = candidate_distribution(seq, temp, [len(x) for x in c] if self.length_norm else None)
            k = int(dist.argmax()) if greedy else int(torch.multinomial(dist.exp(), 1))
            logp = float(dist[k])
            out.append(ActionSample(o.admissible[k], logp, ScoreSample(p, c, k, temp, logp, self.length_norm)))
        return out

    def _act_generate(self, observations, prompts, greedy: bool, temp: float) -> list[ActionSample]:
        replies = sample_replies(self.model, prompts, self.max_new_tokens, temp, greedy, self.pad_id, self.eos_id)
        out = []
        for o, p, (ids, logps) in zip(observations, prompts, replies):
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            action = project_action(parse_action(text), o.admissible)
            out.append(ActionSample(action, float(sum(logps)), GenerateSample(p, ids, temp, logps), reply=text))
        return out

    # --- persistence ------------------------------------------------------------------------
    def num_parameters(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad or not trainable_only)

    def save(self, folder: str | Path) -> Path:
        """Self-contained checkpoint: tokenizer/, model/ (full weights) or adapter/ (+ base/ for a local
        tiny base; a hub base is recorded by name), reference/ when a frozen reference exists."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        lora = hf.is_peft(self.model)
        self.tokenizer.save_pretrained(folder / "tokenizer")
        if self.tiny:
            (folder / "tokenizer" / TINY_MARKER).write_text(json.dumps({"base": self.base}))
        if lora:
            self.model.save_pretrained(folder / "adapter")
            if self.tiny and Path(self.base).resolve() != (folder / "base").resolve():
                shutil.copytree(self.base, folder / "base", dirs_exist_ok=True)
        else:
            self.model.save_pretrained(folder / "model")
        if self.ref_model is not None:
            self.ref_model.save_pretrained(folder / "reference")
        base = "base" if (lora and self.tiny) else self.base
        meta = {"format": FORMAT, "lora": lora, "tiny": self.tiny, "base": base}
        (folder / "policy.json").write_text(json.dumps(meta, indent=1))
        return folder

    @classmethod
    def load(cls, folder: str | Path, policy_cfg: Any, device: str | torch.device | None = None) -> "Policy":
        folder = Path(folder)
        meta_file = folder / "policy.json"
        if not meta_file.exists():
            raise hf.PolicyLoadError(f"{folder}: not a policy checkpoint (no policy.json)")
        meta = json.loads(meta_file.read_text())
        dtype = cfg_get(policy_cfg, "dtype")
        if meta["lora"]:
            base = folder / "base" if meta["base"] == "base" else meta["base"]
            model = hf.load_lora(hf.load_causal_lm(base, dtype, device), folder / "adapter")
        else:
            base = meta["base"]
            model = hf.load_causal_lm(folder / "model", dtype, device)
        ref = hf.load_causal_lm(folder / "reference", dtype, device).eval() if (folder / "reference").exists() else None
        if ref is not None:
            ref.requires_grad_(False)
        return cls(model, hf.load_tokenizer(folder / "tokenizer"), policy_cfg, str(base), meta["tiny"], ref)
