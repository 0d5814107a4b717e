"""``trainer.v1.trainer_mode=milegpo_sync``: verl's synchronous v1 trainer, whose advantage step
also reads each row's ``extra_fields`` from the TransferQueue and hands them to the estimators.

verl's ``PPOTrainer._compute_advantage`` fetches a fixed list of fields and passes the estimator
only rewards, mask, config and ``uid``; this subclass fetches ``extra_fields`` for the same keys
(in the same order), fills ``milegpo_episode`` / ``milegpo_t`` from verl's row key
``{uid}_{session_id}_{turn}`` where the agent loop left them out, and runs verl's own step inside
:func:`~.estimators.turn_fields`. Other estimators run as in ``sync``.
"""
from __future__ import annotations

import transfer_queue as tq
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from .estimators import ESTIMATOR_NAMES, turn_fields

TRAINER_MODE = "milegpo_sync"


def key_fields(key: str, extra: dict) -> dict:
    """A row's extra fields, with episode (the session) and turn taken from its TransferQueue key
    ``{uid}_{session_id}_{index}`` (agent_loop_tq.py) where absent."""
    _, session, turn = key.rsplit("_", 2)
    return {"milegpo_episode": session, "milegpo_t": int(turn), **(extra or {})}


@register_trainer(TRAINER_MODE)
class MileGPOTrainerSync(PPOTrainerSync):
    """verl's ``sync`` trainer with the per-turn fields reaching ``algorithm.adv_estimator=milegpo*``."""

    def _build_replay_buffer(self):
        # verl branches on the mode's name ("sync": replay buffer, refills, checkpoints): behave as "sync"
        self.trainer_mode = "sync"
        return super()._build_replay_buffer()

    def _compute_advantage(self, batch, metrics):
        if self.config.algorithm.adv_estimator not in ESTIMATOR_NAMES:
            return super()._compute_advantage(batch, metrics)
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
        rows = [key_fields(key, extra) for key, extra in zip(batch.keys, list(data["extra_fields"]), strict=True)]
        with turn_fields(rows):
            return super()._compute_advantage(batch, metrics)
