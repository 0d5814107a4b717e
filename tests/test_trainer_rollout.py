"""Group rollouts on the real WebShop simulator: batching, reward convention, invalid-reply
penalty (generate mode), engine errors marking an episode errored and keeping it out of credit."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from envs.base import VectorEnv
from envs.webshop import WebshopConfig, WebshopSuite
from milegpo_cli.policy import Policy
from milegpo_cli.trainer import episode_records, evaluation, seeding
from milegpo_cli.trainer.rollout import INVALID_ACTION, expert_walkthroughs, lane_slots, run_episodes

torch.set_num_threads(1)
TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64,
        "vocab_size": 320}


@pytest.fixture(scope="module")
def suite():
    return WebshopSuite(WebshopConfig(num_products=300, train_instructions=40, eval_instructions=8), max_steps=5)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


def make_policy(suite, models, **cfg):
    return Policy.from_config({"model": "tiny", "tiny": TINY, "max_prompt_tokens": 128, **cfg},
                              suite.text_corpus(), cache_dir=models, device="cpu")


class FaultyEnv(VectorEnv):
    """Fault injection around the real simulator: episode ``victim`` fails at step ``at`` and is
    over from then on (as the StepResult.error contract says), while the inner engine idles it."""

    def __init__(self, inner: VectorEnv, victim: int, at: int):
        self.inner, self.victim, self.at, self.t = inner, victim, at, 0

    @property
    def num_envs(self):
        return self.inner.num_envs

    def reset(self, tasks):
        self.t = 0
        return self.inner.reset(tasks)

    def step(self, actions):
        self.t += 1
        dead = self.t > self.at
        if dead:
            assert actions[self.victim] is None, "an errored episode must not be stepped again"
            actions = [INVALID_ACTION if i == self.victim else a for i, a in enumerate(actions)]
        out = self.inner.step(actions)
        if dead:
            out[self.victim] = None
        elif self.t == self.at:
            out[self.victim] = dataclasses.replace(out[self.victim], error="Traceback: engine crashed", done=True)
        return out


def test_groups_share_tasks_and_reward_convention(suite, models):
    policy = make_policy(suite, models)
    tasks = suite.tasks("train", 2, seed=1)
    venv = suite.make_vector_env(6, oracle=True)
    torch.manual_seed(0)
    eps = run_episodes(policy, venv, tasks, 3, max_steps=suite.max_steps, success_reward=10.0, invalid_penalty=0.1)
    assert [(e.group, e.index, e.task.task_id) for e in eps] == [
        (g, i, tasks[g].task_id) for g in range(2) for i in range(3)]
    for e in eps:
        assert 1 <= e.length <= suite.max_steps
        assert len(e.states) == len(e.rewards) == len(e.samples) == len(e.oracle) == e.length
        assert e.states[0] == "search"  # same initial state within a group
        assert all(label is not None for label in e.oracle)
        assert e.rewards[:-1] == [0.0] * (e.length - 1)
        assert e.rewards[-1] == (10.0 if e.won else 0.0)


def test_episodes_record_the_real_state_after_their_last_step(suite, models):
    """final_state (issue 33): replaying an episode's actions in a fresh engine ends in the recorded state,
    won or not; the credit view and the store record carry it."""
    policy = make_policy(suite, models)
    tasks = suite.tasks("train", 2, seed=4)
    torch.manual_seed(1)
    eps = run_episodes(policy, suite.make_vector_env(4, oracle=False), tasks, 2, max_steps=suite.max_steps,
                       success_reward=10.0, invalid_penalty=0.1)
    replay = suite.make_vector_env(1, oracle=False)
    for e in eps:
        replay.reset([e.task])
        for a in e.actions:
            [res] = replay.step([a if a is not None else INVALID_ACTION])
        assert e.final_state and e.final_state == res.observation.state_key
        assert episode_records.to_rollout(e).final_state == episode_records.episode_record(e).final_state == e.final_state


def test_invalid_generate_replies_are_penalised_not_crashes(suite, models):
    policy = make_policy(suite, models, action_mode="generate", max_new_tokens=6)
    venv = suite.make_vector_env(2)
    torch.manual_seed(0)
    eps = run_episodes(policy, venv, suite.tasks("train", 1, seed=2), 2, max_steps=suite.max_steps,
                       success_reward=10.0, invalid_penalty=0.1)
    steps = [(a, r, bad) for e in eps for a, r, bad in zip(e.actions, e.rewards, e.invalid)]
    invalid = [s for s in steps if s[0] is None]
    assert invalid, "an untrained tiny model should write unparsable replies"
    assert all(r == pytest.approx(-0.1) and bad for _, r, bad in invalid)
    assert all(e.length == suite.max_steps for e in eps if not e.won)  # no-op steps count
    ep = next(e for e in eps if None in e.actions)
    rec = episode_records.episode_record(ep)
    assert [s.action == INVALID_ACTION for s in rec.steps] == [a is None for a in ep.actions]


def test_engine_error_marks_episode_errored_and_out_of_credit(suite, models):
    policy = make_policy(suite, models)
    venv = FaultyEnv(suite.make_vector_env(4, oracle=True), victim=1, at=2)
    torch.manual_seed(0)
    eps = run_episodes(policy, venv, suite.tasks("train", 2, seed=3), 2, max_steps=suite.max_steps,
                       success_reward=10.0, invalid_penalty=0.1)
    assert eps[1].errored and eps[1].length == 2 and "engine crashed" in eps[1].error
    assert not any(e.errored for i, e in enumerate(eps) if i != 1)
    metrics = evaluation.episode_metrics(eps)
    assert metrics["errored"] == 1.0 and metrics["episodes"] == 4.0


def test_expert_walkthroughs_follow_the_oracle(suite):
    venv = suite.make_vector_env(3, oracle=True)
    steps, won = expert_walkthroughs(venv, suite.tasks("train", 4, seed=4), suite.max_steps)
    assert won >= 1 and steps
    assert all(s.action in s.observation.oracle_actions for s in steps)
    assert all(s.steps_taken == len(s.history) for s in steps)


def test_derived_seeds_are_pure_and_distinct():
    assert seeding.derive_seed(0, "iteration", 1) == seeding.derive_seed(0, "iteration", 1)
    assert len({seeding.derive_seed(s, "iteration", i) for s in range(3) for i in range(50)}) == 150


def test_lanes_split_groups_into_contiguous_blocks():
    assert lane_slots(4, 4, 2) == [list(range(8)), list(range(8, 16))]
    assert lane_slots(3, 2, 2) == [[0, 1], [2, 3, 4, 5]]
    assert lane_slots(1, 3, 2) == [[0, 1, 2]]  # never an empty lane
    assert lane_slots(2, 2, 1) == [[0, 1, 2, 3]]


def test_lanes_need_an_env_that_steps_a_subset(suite, models):
    """WebShop steps all its episodes in one call (partial_steps is False): lanes fall back to one,
    so the episodes are those of a single lane."""
    policy = make_policy(suite, models)
    tasks = suite.tasks("train", 2, seed=1)
    played = []
    for lanes in (1, 2):
        torch.manual_seed(0)
        eps = run_episodes(policy, suite.make_vector_env(6, oracle=False), tasks, 3, max_steps=suite.max_steps,
                           success_reward=10.0, invalid_penalty=0.1, lanes=lanes)
        played.append([(e.actions, e.logps) for e in eps])
    assert played[0] == played[1]
