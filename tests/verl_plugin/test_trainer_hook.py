"""``trainer.v1.trainer_mode=milegpo_sync``: the per-turn fields travel from the agent loop's
outputs through a real TransferQueue (on a local Ray) into verl's v1 advantage step.

The rows are our agent loop's outputs (``turn_outputs``) put by verl's own
``AgentLoopWorkerTQ._agent_loop_postprocess`` (float32 ``rm_scores`` on the last token, keys
``{uid}_{session_id}_{turn}``); episode and turn come from the keys. The advantages the trainer writes back to the queue equal
``milegpo credit``'s on the same episodes.
"""
import asyncio
import dataclasses

import numpy as np
import pytest
import ray
import torch
from omegaconf import OmegaConf
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo.v1 import get_trainer_cls

from milegpo_cli.integrations.verl.agent_loops import turn_outputs
from milegpo_cli.integrations.verl.trainer import TRAINER_MODE, MileGPOTrainerSync
from milegpo_cli.integrations.verl.turns import rollout_rows

from test_estimators import milegpo_credit, recorded, with_invalid_and_singletons

import transfer_queue as tq  # noqa: E402  (after verl: the plugin order verl uses)


@pytest.fixture(scope="module")
def queue():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # never a running cluster
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    yield
    tq.close()
    ray.shutdown()


def put_turns(rollouts):
    """The turns of ``rollouts`` as our agent loop returns them (``turn_outputs``), put into the queue
    by verl's own ``AgentLoopWorkerTQ._agent_loop_postprocess`` (partition "train"), sessions in shuffled
order; returns the
    keys and {key: (group, rollout id, t)}."""
    outcomes, index, fields = rollout_rows(rollouts)
    rng = np.random.default_rng(0)
    episodes: dict = {}
    for outcome, uid, f in zip(outcomes, index, fields):
        episodes.setdefault((uid, f["milegpo_episode"]), []).append(f)
    worker_cls = AgentLoopWorkerTQ.__ray_actor_class__  # the class behind verl's Ray actor
    worker = worker_cls.__new__(worker_cls)  # with only what the put path reads
    worker.processor, worker.reward_loop_worker_handles, worker.distillation_enabled = None, None, False
    keys, where, sessions = [], {}, {}
    for k in rng.permutation(len(episodes)):
        (uid, episode), turns = list(episodes.items())[k]
        session = sessions.setdefault(uid, {}).setdefault(episode, len(sessions[uid]))
        final, score = turns[0]["milegpo_final_state"], turns[0]["milegpo_reward"]
        outputs = turn_outputs([([1, 2, 3], list(range(4, 4 + int(rng.integers(1, 7)))), None,
                                 {k: v for k, v in f.items() if k not in ("milegpo_episode", "milegpo_t",
                                                                           "milegpo_final_state", "milegpo_reward")})
                                for f in turns], final, score)
        asyncio.run(worker._agent_loop_postprocess(outputs, False, uid=uid, session_id=session, global_steps=1))
        for f in turns:
            key = f"{uid}_{session}_{f['milegpo_t']}"
            keys.append(key)
            where[key] = (uid, episode, f["milegpo_t"])
    return keys, where


def trainer(estimator):
    """The registered trainer class, with only the config its advantage step reads."""
    cls = get_trainer_cls(TRAINER_MODE)
    t = cls.__new__(cls)
    algorithm = OmegaConf.merge(OmegaConf.structured(AlgoConfig(adv_estimator=estimator)), {"rollout_correction": None})
    t.config = OmegaConf.create({"algorithm": algorithm, "actor_rollout_ref": {"rollout": {"n": 8}}})
    return t


@pytest.mark.parametrize("estimator, algo", [("milegpo", "milegpo"), ("milegpo_graphgpo", "graphgpo")])
def test_fields_reach_the_estimator_through_the_queue(queue, tmp_path, estimator, algo):
    rollouts = [dataclasses.replace(r, group=f"{estimator}/{r.group}")  # keys of their own in the queue
                for r in with_invalid_and_singletons(recorded("webshop_final", 6), seed=3)]
    keys, where = put_turns(rollouts)
    t = trainer(estimator)
    assert isinstance(t, MileGPOTrainerSync)
    t._compute_advantage(KVBatchMeta(keys=keys, tags=[{}] * len(keys), partition_id="train"), metrics={})
    got = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["advantages", "response_mask", "rm_scores"])
    reference = milegpo_credit(tmp_path, rollouts, algo)
    worst = 0.0
    for k, key in enumerate(keys):
        adv, mask = got["advantages"][k], got["response_mask"][k]
        assert got["rm_scores"][k].sum().item() == pytest.approx(next(
            r.outcome for r in rollouts if r.group == where[key][0] and str(r.rollout_id) == where[key][1]), abs=1e-6)
        want = reference[where[key]] * mask.to(torch.float64)
        worst = max(worst, (adv.to(torch.float64) - want).abs().max().item())
    assert worst <= 2e-6, worst  # verl writes advantages back as float32
    assert max(abs(v) for v in reference.values()) > 0


def test_other_estimators_run_as_in_sync(queue):
    rollouts = [dataclasses.replace(r, group=f"grpo/{r.group}") for r in recorded("alfworld_final", 2)]
    keys, _ = put_turns(rollouts)
    t = trainer("grpo")
    t._compute_advantage(KVBatchMeta(keys=keys, tags=[{}] * len(keys), partition_id="train"), metrics={})
    got = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["advantages"])
    assert len(got["advantages"]) == len(keys)
