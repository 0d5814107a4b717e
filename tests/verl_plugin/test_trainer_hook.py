"""``trainer.v1.trainer_mode=milegpo_sync``: the per-turn fields travel from the agent loop's
outputs through a real TransferQueue (on a local Ray) into verl's v1 advantage step.

The rows are put exactly as verl's ``AgentLoopWorkerTQ`` puts them (``AgentLoopOutput.as_dict``,
float32 ``rm_scores`` on the last token, keys ``{uid}_{session_id}_{turn}``); the agent loop here
leaves episode and turn to the keys. The advantages the trainer writes back to the queue equal
``milegpo credit``'s on the same episodes.
"""
import numpy as np
import pytest
import ray
import torch
from omegaconf import OmegaConf
from transfer_queue import KVBatchMeta
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo.v1 import get_trainer_cls
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from milegpo_cli.integrations.verl.trainer import TRAINER_MODE, MileGPOTrainerSync
from milegpo_cli.integrations.verl.turns import rollout_rows

from test_estimators import milegpo_credit, recorded, with_invalid_and_singletons

import transfer_queue as tq  # noqa: E402  (after verl: the plugin order verl uses)


@pytest.fixture(scope="module")
def queue():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    yield
    tq.close()
    ray.shutdown()


def put_turns(rollouts, partition):
    """The turn outputs of ``rollouts`` into the queue as AgentLoopWorkerTQ does; returns keys and
    {key: (group, rollout id, t)}."""
    outcomes, index, fields = rollout_rows(rollouts)
    rng = np.random.default_rng(0)
    sessions = {}
    keys, rows, where = [], [], {}
    for outcome, uid, f in zip(outcomes, index, fields):
        session = sessions.setdefault((uid, f["milegpo_episode"]), sum(u == uid for u, _ in sessions))
        key = f"{uid}_{session}_{f['milegpo_t']}"
        n = int(rng.integers(1, 7))
        extra = {k: v for k, v in f.items() if k not in ("milegpo_episode", "milegpo_t")}
        out = AgentLoopOutput(prompt_ids=[1, 2, 3], response_ids=list(range(4, 4 + n)), response_mask=[1] * n,
                              reward_score=float(outcome), num_turns=2, metrics=AgentLoopMetrics(), extra_fields=extra)
        row = out.as_dict()
        row["uid"] = uid
        keys.append(key)
        rows.append(row)
        where[key] = (uid, f["milegpo_episode"], f["milegpo_t"])
    order = rng.permutation(len(keys))
    keys, rows = [keys[k] for k in order], [rows[k] for k in order]
    tq.kv_batch_put(keys=keys, partition_id=partition, fields=list_of_dict_to_tensordict(rows))
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
    rollouts = with_invalid_and_singletons(recorded("webshop_final", 6), seed=3)
    partition = f"train-{estimator}"
    keys, where = put_turns(rollouts, partition)
    t = trainer(estimator)
    assert isinstance(t, MileGPOTrainerSync)
    t._compute_advantage(KVBatchMeta(keys=keys, tags=[{}] * len(keys), partition_id=partition), metrics={})
    got = tq.kv_batch_get(keys=keys, partition_id=partition, select_fields=["advantages", "response_mask"])
    reference = milegpo_credit(tmp_path, rollouts, algo)
    worst = 0.0
    for k, key in enumerate(keys):
        adv, mask = got["advantages"][k], got["response_mask"][k]
        want = reference[where[key]] * mask.to(torch.float64)
        worst = max(worst, (adv.to(torch.float64) - want).abs().max().item())
    assert worst <= 2e-6, worst  # verl writes advantages back as float32
    assert max(abs(v) for v in reference.values()) > 0


def test_other_estimators_run_as_in_sync(queue):
    rollouts = recorded("alfworld_final", 2)
    keys, _ = put_turns(rollouts, "train-grpo")
    t = trainer("grpo")
    t._compute_advantage(KVBatchMeta(keys=keys, tags=[{}] * len(keys), partition_id="train-grpo"), metrics={})
    got = tq.kv_batch_get(keys=keys, partition_id="train-grpo", select_fields=["advantages"])
    assert len(got["advantages"]) == len(keys)
