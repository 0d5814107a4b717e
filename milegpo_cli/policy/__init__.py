"""Policy layer: any HF causal LM (+LoRA), the local tiny model, prompts and the two action modes."""
from .actions import (ActionSample, GenerateSample, PolicyError, ScoreSample, candidate_logprobs,
                      generate_sample_logprobs, score_sample_logprobs, token_logprobs)
from .core import MODES, Policy
from .hf import PolicyLoadError
from .replies import parse_action, project_action
from .tiny import TinyModelError

__all__ = [
    "ActionSample", "GenerateSample", "MODES", "Policy", "PolicyError", "PolicyLoadError", "ScoreSample",
    "TinyModelError", "candidate_logprobs", "generate_sample_logprobs", "parse_action", "project_action",
    "score_sample_logprobs", "token_logprobs",
]
