"""The ALFWorld and WebShop agent loops play our real engines for a few turns, driven by a scripted
LLM-server stand-in (the only stand-in: verl's agent-loop base class, tokenizer path and our
engines are real). Each turn row carries what our own trainer records for the same replies
(``run_episodes``: state keys, actions, invalid flags, rewards with the invalid-action penalty,
final state, score), and the rows go through verl's TransferQueue key format into the estimators.
"""
import asyncio
import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, _agent_loop_registry
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.workers.rollout.replica import TokenOutput
from verl import DataProto

from milegpo_cli.integrations.verl.agent_loops import AlfworldAgentLoop, WebshopAgentLoop
from milegpo_cli.integrations.verl.estimators import turn_fields
from milegpo_cli.integrations.verl.trainer import key_fields
from milegpo_cli.policy import project_action
from milegpo_cli.policy.prompts import template_corpus
from milegpo_cli.policy.tiny import train_tokenizer
from milegpo_cli.trainer.rollout import run_episodes

ROOT = Path(__file__).resolve().parents[2]
ADMISSIBLE = re.compile(r"Your admissible actions of the current situation are: \[(.*)\]\.\n", re.DOTALL)
CHAT = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def choose(turn: int, listed: str) -> str | None:
    """The script, on the prompt's list of admissible commands: turn 1 answers without an action;
    else the (7t mod n)-th piece of the list split at ", " (a WebShop command holding a comma gives
    an inadmissible piece: another invalid reply)."""
    pieces = listed.split(", ")
    return None if turn == 1 else pieces[(7 * turn) % len(pieces)]


@pytest.fixture(scope="module")
def tokenizer():
    tok = train_tokenizer(template_corpus() + ["go to countertop 1", "I am not sure."], 400)
    tok.chat_template = CHAT
    return tok


class ScriptedServer:
    """Stands in for verl's LLMServerClient: reads the admissible commands off the prompt and replies
    per :func:`choose` in the <think>/<action> format our prompt asks for."""

    def __init__(self, tokenizer):
        self.tokenizer, self.turn = tokenizer, 0

    async def generate(self, request_id, prompt_ids, sampling_params, **_):
        action = choose(self.turn, ADMISSIBLE.search(self.tokenizer.decode(prompt_ids)).group(1))
        self.turn += 1
        reply = f"<think>step {self.turn}</think><action>{action}</action>" if action else "I am not sure."
        ids = self.tokenizer.encode(reply)
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids))


class ScriptedPolicy:
    """The same script as our trainer's policy in generate mode (reply parsed, projected onto the
    admissible commands; ``run_episodes`` plays it)."""

    def act(self, observations, histories, steps, **_):
        return [SimpleNamespace(action=project_action(choose(t, ", ".join(o.admissible)), o.admissible), logp=0.0,
                                sample=None) for o, t in zip(observations, steps)]


def play(cls, tokenizer, env_config, split, index, max_steps):
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"response_length": 64, "prompt_length": 4096}}})

    async def session():  # built inside the running event loop, as verl's AgentLoopWorker does
        loop = cls(trainer_config=DictConfigWrap(config), server_manager=ScriptedServer(tokenizer), tokenizer=tokenizer,
                   processor=None, dataset_cls=None, data_config=DictConfigWrap(OmegaConf.create({})),
                   env_config=env_config, max_steps=max_steps)
        return loop, await loop.run({"temperature": 1.0}, extra_info={"milegpo_split": split, "milegpo_index": index})

    loop, outputs = asyncio.run(session())
    ep = run_episodes(ScriptedPolicy(), loop.suite.make_vector_env(1), [loop.task({"extra_info": {
        "milegpo_split": split, "milegpo_index": index}})], 1, max_steps=max_steps, success_reward=10.0,
                      invalid_penalty=0.1)[0]
    return outputs, ep


def check_rows_match_our_trainer(outputs, ep, tokenizer):
    fields = [o.extra_fields for o in outputs]
    assert len(outputs) == ep.length >= 3
    assert [f["milegpo_t"] for f in fields] == list(range(ep.length))
    assert [f["milegpo_state"] for f in fields] == ep.states
    assert [f["milegpo_action"] for f in fields] == [a or "<invalid>" for a in ep.actions]
    assert [f["milegpo_invalid"] for f in fields] == ep.invalid
    assert fields[1]["milegpo_invalid"] and not all(ep.invalid)
    assert [f["milegpo_step_reward"] for f in fields] == ep.rewards
    assert {f["milegpo_final_state"] for f in fields} == {ep.final_state}
    assert {o.reward_score for o in outputs} == {f["milegpo_reward"] for f in fields} == {ep.score}
    for o in outputs:
        assert len(o.response_ids) == len(o.response_mask) == len(o.response_logprobs) > 0
        assert "Your admissible actions" in tokenizer.decode(o.prompt_ids)
    assert "<|assistant|>" in tokenizer.decode(outputs[0].prompt_ids)


def test_registered_under_their_names():
    assert _agent_loop_registry["milegpo_alfworld"]["_target_"].endswith("agent_loops.AlfworldAgentLoop")
    assert _agent_loop_registry["milegpo_webshop"]["_target_"].endswith("agent_loops.WebshopAgentLoop")


def test_alfworld_loop_plays_our_engine(tokenizer, alfworld_config):
    outputs, ep = play(AlfworldAgentLoop, tokenizer, dataclasses.asdict(alfworld_config), "train", 0, max_steps=5)
    check_rows_match_our_trainer(outputs, ep, tokenizer)


def test_webshop_loop_plays_our_engine_and_feeds_the_estimator(tokenizer):
    env_config = {"seed": 3, "num_products": 700, "train_instructions": 150, "eval_instructions": 60}
    sessions = [play(WebshopAgentLoop, tokenizer, env_config, "train", i, max_steps=4) for i in range(2)]
    for outputs, ep in sessions:
        check_rows_match_our_trainer(outputs, ep, tokenizer)
    # two sessions of one uid, through verl's row keys and compute_advantage
    rows = [(f"task-0_{s}_{t}", o) for s, (outputs, _) in enumerate(sessions) for t, o in enumerate(outputs)]
    fields = [key_fields(key, {k: v for k, v in o.extra_fields.items() if k != "milegpo_t"}) for key, o in rows]
    width = max(len(o.response_ids) for _, o in rows)
    mask = torch.tensor([[1.0] * len(o.response_ids) + [0.0] * (width - len(o.response_ids)) for _, o in rows])
    rewards = torch.zeros_like(mask)
    rewards[torch.arange(len(rows)), mask.sum(-1).long() - 1] = torch.tensor([o.reward_score for _, o in rows])
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                               non_tensors={"uid": np.array(["task-0"] * len(rows), dtype=object)})
    with turn_fields(fields):
        out = compute_advantage(data, adv_estimator="milegpo_grpo", config=OmegaConf.create({}))
    assert out.batch["advantages"].shape == mask.shape and torch.isfinite(out.batch["advantages"]).all()


def test_dataset_rows_reach_the_agent_loop_through_verls_dataset(tmp_path, tokenizer):
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from milegpo_cli.integrations.verl.dataset import main

    path = tmp_path / "train.parquet"
    assert main(["webshop", "train", "3", str(path), "--seed", "2"]) == 0
    data = RLHFDataset(data_files=[str(path)], tokenizer=tokenizer, processor=None,
                       config=OmegaConf.create({"cache_dir": str(tmp_path / "cache"), "max_prompt_length": 256}))
    row = data[2]
    assert row["agent_name"] == "milegpo_webshop"
    assert row["extra_info"]["milegpo_index"] == 2 and row["extra_info"]["milegpo_seed"] == 2
    with pytest.raises(SystemExit) as exit_info:
        main(["chess", "train", "3", str(path)])
    assert exit_info.value.code == 2


def test_the_agent_loop_config_file_instantiates_as_verl_does(tokenizer, alfworld_config):
    """bench/verl_agent_loops.yaml through hydra.utils.instantiate, the call of verl's AgentLoopWorker."""
    import hydra

    entries = {e.name: e for e in OmegaConf.load(ROOT / "bench" / "verl_agent_loops.yaml")}
    entry = OmegaConf.merge(entries["milegpo_alfworld"], {"env_config": dataclasses.asdict(alfworld_config)})
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"response_length": 64}}})

    async def build():
        return hydra.utils.instantiate(config=entry, trainer_config=DictConfigWrap(config), server_manager=None,
                                       tokenizer=tokenizer, processor=None, dataset_cls=None,
                                       data_config=DictConfigWrap(OmegaConf.create({})))

    loop = asyncio.run(build())
    assert isinstance(loop, AlfworldAgentLoop)
    assert (loop.max_steps, loop.history, loop.success_reward, loop.invalid_penalty) == (8, 2, 10.0, 0.1)
