"""Prompts in the verl-agent / ALFWorld convention.

The prompt holds the task, "you have already taken K step(s)", the last ``history`` (observation,
action) pairs, the current observation and the admissible actions. In ``generate`` mode it ends
with the instruction to think in <think>...</think> and answer in <action>...</action>; in
``score`` mode the candidates are scored as continuations of a compact prompt ending in
"Action:", so the instruction is left out.

Truncation to ``max_prompt_tokens``: oldest history pairs are dropped first; if the prompt is still
too long, the current observation keeps its longest head that fits (cut at a token boundary and
marked " ..."), so the task line and the admissible actions stay whole (a WebShop results page is
longer than the whole budget); only if even that cannot fit are the token ids cut from the left.
"""
from __future__ import annotations

from functools import partial
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
            render = partial(build_prompt, mode, task, admissible=admissible, history=[], steps_taken=steps_taken)
            fitted = _fit_observation(tokenizer, render, observation.strip(), max_prompt_tokens)
            return fitted if fitted is not None else ids[-max_prompt_tokens:]
        pairs = pairs[1:]


def _fit_observation(tokenizer, render, observation: str, limit: int) -> list[int] | None:
    """Token ids of ``render(head + " ...")`` for the longest head of ``observation`` (cut at one of
    its token boundaries) that fits in ``limit`` tokens; None if not even an empty head fits, or if the
    tokenizer gives no character offsets (a slow, Python tokenizer)."""
    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False).input_ids

    try:
        offsets = tokenizer(observation, add_special_tokens=False, return_offsets_mapping=True).offset_mapping
    except NotImplementedError:
        return None
    keep = min(len(offsets), limit - len(encode(render(" ..."))))
    while keep > 0:
        ids = encode(render(observation[:offsets[keep - 1][1]] + " ..."))
        if len(ids) <= limit:
            return ids
        keep -= len(ids) - limit
    return None


def template_corpus() -> list[str]:
    """The fixed text of the templates and tags, added to the tiny tokenizer's training corpus."""
    skeleton = {"task": "", "steps": 0, "k": 0, "history": "[Observation 1: '', Action 1: '']", "current": 1,
                "observation": "", "admissible": ""}
    return [GENERATE_TEMPLATE.format(**skeleton), SCORE_TEMPLATE.format(**skeleton),
            "<think> </think> <action> </action>"]
