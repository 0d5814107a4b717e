"""Prompts in the verl-agent / ALFWorld convention.

The prompt holds the task, "you have already taken K step(s)", the last ``history`` (observation,
action) pairs, the current observation and the admissible actions. In ``generate`` mode it ends
with the instruction to think in <think>...</think> and answer in <action>...</action>; in
``score`` mode the candidates are scored as continuations of a compact prompt ending in
"Action:", so the instruction is left out.

Truncation to ``max_prompt_tokens``: oldest history pairs are dropped first (the task line is
the most useful part of the prompt), then the token ids are cut from the left.
"""
from __future__ import annotations

from typing import Sequence

GENERATE_TEMPLATE = (
    "You are an expert agent operating in a text environment. Your task is to: {task}\n"
    "Prior to this step, you have already taken {steps} step(s). Below are the most recent {k} "
    "observations and the corresponding actions you took: {history}\n"
    "You are now at step {current} and your current observation is: {observation}\n"
    "Your admissible actions of the current situation are: [{admissible}].\n\n"
    "Now it's your turn to take an action.\n"
    "You should first reason step-by-step about the current situation. This reasoning process MUST be "
    "enclosed within <think> </think> tags. \n"
    "Once you've finished your reasoning, you should choose an admissible action for current step and "
    "present it within <action> </action> tags.\n"
)

SCORE_TEMPLATE = (
    "Task: {task}\n"
    "You have taken {steps} step(s). Recent history: {history}\n"
    "Step {current}. Observation: {observation}\n"
    "Admissible actions: [{admissible}].\n"
    "Action:"
)


def strip_task(task: str) -> str:
    """"Your task is to: put a hot apple in countertop." -> "put a hot apple in countertop."."""
    text = task.strip()
    for prefix in ("Your task is to:", "Your task is to"):
        if text.startswith(prefix):
            return text[len(prefix):].strip()
    return text


def format_history(pairs: Sequence[tuple[str, str]], first_step: int) -> str:
    if not pairs:
        return "none"
    return "".join(f"\n[Observation {first_step + i}: '{obs.strip()}', Action {first_step + i}: '{act}']"
                   for i, (obs, act) in enumerate(pairs))


def build_prompt(mode: str, task: str, observation: str, admissible: Sequence[str],
                 history: Sequence[tuple[str, str]], steps_taken: int) -> str:
    """The prompt text for one step; ``history`` is the list of pairs to show (already cut to K)."""
    template = GENERATE_TEMPLATE if mode == "generate" else SCORE_TEMPLATE
    return template.format(
        task=strip_task(task), steps=steps_taken, k=len(history),
        history=format_history(history, steps_taken - len(history) + 1),
        current=steps_taken + 1, observation=observation.strip(), admissible=", ".join(admissible),
    )


def encode_prompt(tokenizer, mode: str, task: str, observation: str, admissible: Sequence[str],
                  history: Sequence[tuple[str, str]], steps_taken: int, history_len: int,
                  max_prompt_tokens: int | None) -> list[int]:
    """Token ids of the prompt, fitted to ``max_prompt_tokens`` (see module docstring)."""
    pairs = list(history)[-history_len:] if history_len > 0 else []
    while True:
        ids = tokenizer(build_prompt(mode, task, observation, admissible, pairs, steps_taken),
                        add_special_tokens=False).input_ids
        if not max_prompt_tokens or len(ids) <= max_prompt_tokens:
            return ids
        if not pairs:
            return ids[-max_prompt_tokens:]
        pairs = pairs[1:]


def template_corpus() -> list[str]:
    """The fixed text of the templates and tags, added to the tiny tokenizer's training corpus."""
    skeleton = {"task": "", "steps": 0, "k": 0, "history": "[Observation 1: '', Action 1: '']", "current": 1,
                "observation": "", "admissible": ""}
    return [GENERATE_TEMPLATE.format(**skeleton), SCORE_TEMPLATE.format(**skeleton),
            "<think> </think> <action> </action>"]
