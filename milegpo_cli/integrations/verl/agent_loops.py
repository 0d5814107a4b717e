"""ALFWorld and WebShop as verl agent loops (``actor_rollout_ref.rollout.agent.default_agent_loop``
= ``milegpo_alfworld`` / ``milegpo_webshop``, or a dataset column ``agent_name``).

One episode of the project's engine per verl session, one ``AgentLoopOutput`` per turn: the prompt
is our trainer's generate-mode prompt (task, the last ``history`` (observation, action) pairs, the
observation, the admissible commands), the reply is parsed and projected onto the admissible
commands as our trainer does, an unparsable or inadmissible reply is sent as the never-admissible
``<invalid>`` (a no-op step) and costs ``invalid_penalty``; the winning step earns
``success_reward``. An engine error leaves the session out (no rows), as our trainer leaves the
episode out of the update. Each turn carries the episode's score as ``reward_score`` and the fields of
:data:`~.turns.FIELDS` in ``extra_fields``. The dataset row names the task: ``extra_info`` =
``{"milegpo_split": "train", "milegpo_index": i, "milegpo_seed": 0}`` (``suite.tasks(split, 1,
seed, start=i)``). Engine calls block the worker's event loop (one engine episode per session).
"""
from __future__ import annotations

import json
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from envs.registry import make_suite
from ...policy import parse_action, project_action
from ...policy.prompts import build_prompt
from ...trainer.rollout import INVALID_ACTION
from .turns import REWARD

_SUITES: dict = {}  # (env, settings) -> EnvSuite, one per worker process


def suite_for(env: str, settings: dict):
    """The worker's suite of ``env`` built from ``settings`` (AlfworldConfig / WebshopConfig fields)."""
    settings = {k: tuple(v) if isinstance(v, list) else v for k, v in settings.items()}  # yaml lists
    key = (env, json.dumps(settings, sort_keys=True, default=str))
    if key not in _SUITES:
        if env == "alfworld":
            from envs.alfworld.config import AlfworldConfig
            _SUITES[key] = make_suite(env, alfworld=AlfworldConfig(**settings))
        else:
            from envs.webshop.config import WebshopConfig
            _SUITES[key] = make_suite(env, webshop=WebshopConfig(**settings))
    return _SUITES[key]


def turn_outputs(turns, final_state: str, score: float) -> list[AgentLoopOutput]:
    """One AgentLoopOutput per turn ``(prompt_ids, reply_ids, logprobs, fields)``: the episode's score as
    ``reward_score`` (verl then skips its reward loop) and ``reward_extra_info`` (which verl copies
    from the last turn to the others), the turn's fields with the episode's final state and score."""
    return [AgentLoopOutput(prompt_ids=p, response_ids=r, response_mask=[1] * len(r),
                            response_logprobs=lp[: len(r)] if lp else None, reward_score=score, num_turns=2,
                            metrics=AgentLoopMetrics(),
                            extra_fields={**f, "milegpo_final_state": final_state, REWARD: score, "reward_extra_info": {}})
            for p, r, lp, f in turns]


class EngineAgentLoop(AgentLoopBase):
    """One episode of ``env`` per session; settings (agent-loop yaml entry or defaults): ``env_config``
    (AlfworldConfig / WebshopConfig fields), ``max_steps`` (the suite's), ``history`` 2,
    ``success_reward`` 10, ``invalid_penalty`` 0.1 (our recipe's defaults, milegpo_cli/config.py)."""

    env: str = ""

    def __init__(self, *args, env_config: dict | None = None, max_steps: int | None = None, history: int = 2,
                 success_reward: float = 10.0, invalid_penalty: float = 0.1, **kwargs):
        super().__init__(*args, **kwargs)
        self.suite = suite_for(self.env, dict(env_config or {}))
        self.max_steps = max_steps or self.suite.max_steps
        self.history, self.success_reward, self.invalid_penalty = history, success_reward, invalid_penalty
        self.response_length = self.rollout_config.response_length

    def task(self, kwargs: dict):
        info = kwargs.get("extra_info") or {}
        try:
            split, index = str(info["milegpo_split"]), int(info["milegpo_index"])
        except KeyError as err:
            raise ValueError(f"extra_info.{err.args[0]}: missing in the dataset row (docs/scale.md, "
                             "'MileGPO in verl')") from None
        return self.suite.tasks(split, 1, int(info.get("milegpo_seed", 0)), start=index)[0]

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> list[AgentLoopOutput]:
        venv = self.suite.make_vector_env(1)
        try:
            obs = venv.reset([self.task(kwargs)])[0]
            turns, pairs = [], []
            score = 0.0
            for t in range(self.max_steps):
                text = build_prompt("generate", obs.task, obs.text, obs.admissible,
                                    pairs[-self.history:] if self.history else [], t)
                prompt_ids = await self.ct_build_initial_tokens([{"role": "user", "content": text}])
                out = await self.server_manager.generate(request_id=uuid4().hex, prompt_ids=prompt_ids,
                                                         sampling_params=sampling_params)
                reply_ids = out.token_ids[: self.response_length]
                action = project_action(parse_action(self.tokenizer.decode(reply_ids, skip_special_tokens=True)),
                                        obs.admissible)
                res = venv.step([action if action is not None else INVALID_ACTION])[0]
                invalid = bool(res.invalid) or action is None
                score = float(res.score)
                reward = (self.success_reward if (res.done and res.won) else 0.0) - (self.invalid_penalty if invalid else 0.0)
                turns.append((prompt_ids, reply_ids, out.log_probs, {
                    "milegpo_t": t, "milegpo_state": obs.state_key, "milegpo_action": action or INVALID_ACTION,
                    "milegpo_invalid": invalid, "milegpo_step_reward": reward}))
                pairs.append((obs.text, action or ""))
                obs = res.observation
                if res.error is not None:  # an engine error: left out of training, as our trainer does
                    return []
                if res.done:
                    break
        finally:
            venv.close()
        return turn_outputs(turns, obs.state_key, score)


@register("milegpo_alfworld")
class AlfworldAgentLoop(EngineAgentLoop):
    env = "alfworld"


@register("milegpo_webshop")
class WebshopAgentLoop(EngineAgentLoop):
    env = "webshop"
