"""Throughput switches change nothing: same seed and recipe give identical episodes, advantages and
final weights with the transition cache, the oracle sampling and the engine memo tables on or off."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from milegpo_cli.config import load_config
from milegpo_cli.trainer import builders, iteration as one_iteration, seeding
from milegpo_cli.trainer.ppo import PPOUpdater
from milegpo_cli.trainer.threads import plan_threads
from conftest import TINY_MODEL

os.environ.setdefault("ALFWORLD_DATA", str(Path(__file__).resolve().parents[1] / "runs" / "alfworld_data"))

TINY = [*TINY_MODEL,
        "rollout.groups=2", "rollout.group_size=3", "rollout.train_tasks=4",
        "run.threads=1", "env.max_steps=6", "env.alfworld.workers=0", "env.alfworld.expert=\"planner\"",
        f"env.alfworld.data_dir={json.dumps(str(Path(__file__).resolve().parents[1] / 'runs' / 'alfworld'))}"]


def _train(root: Path, switches: list[str], memo: bool):
    from envs.alfworld import engine_caches

    engine_caches.install_engine_caches(True, grammar=memo, reuse=memo)
    try:
        config = load_config("alfworld", [*TINY, f"store.root={json.dumps(str(root))}", *switches])
        threads = plan_threads(config)
        suite = builders.build_suite(config, threads.rollout.workers)
        venv = suite.make_vector_env(6, oracle=config.env.oracle)
        seeding.seed_everything(0)
        policy = builders.build_policy(config, suite, "cpu")
        updater = PPOUpdater(policy, config.ppo, builders.make_accelerator(config), total_updates=2)
        pool = one_iteration.train_pool(config, suite)
        out = []
        for it in (1, 2):
            res = one_iteration.train_iteration(config, policy, updater, venv, pool, suite, it, threads=threads)
            out.append([(e.task_id, [(s.state_key, s.action, s.reward, s.advantage, s.subgoals) for s in e.steps])
                        for e in res.episodes])
            out.append([s.oracle_good for e in res.episodes for s in e.steps])
        venv.close()
        return out, res.metrics, {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
    finally:
        engine_caches.install_engine_caches(True)


def test_switches_give_identical_episodes_advantages_and_weights(tmp_path):
    (tmp_path / "models").mkdir()
    fast, m_fast, w_fast = _train(tmp_path, ["env.alfworld.cache=true", 'env.oracle="sample"'], memo=True)
    slow, m_slow, w_slow = _train(tmp_path, ["env.alfworld.cache=false", 'env.oracle="all"'], memo=False)
    assert fast[0] == slow[0] and fast[2] == slow[2]  # episodes and advantages, both iterations
    labels_fast, labels_slow = fast[1] + fast[3], slow[1] + slow[3]
    assert all(a is None or a == b for a, b in zip(labels_fast, labels_slow))  # sampled labels are the same labels
    assert any(a is None for a in labels_fast) and not any(b is None for b in labels_slow)
    assert m_fast["cache_hit_rate"] > 0 and m_slow["cache_hit_rate"] == 0
    assert w_fast.keys() == w_slow.keys() and all(torch.equal(w_fast[k], w_slow[k]) for k in w_fast)


def test_engine_workers_stepping_beside_the_policy_change_nothing(tmp_path):
    """Rollout lanes with the engines in two worker processes (stepping one lane while the policy
    acts for the other) give the same episodes, advantages and weights as the same lanes in-process."""
    (tmp_path / "models").mkdir()
    lanes = ["rollout.lanes=2", "run.threads=2", "rollout.threads=1", "ppo.micro_batch_size=2"]
    local, _, w_local = _train(tmp_path, [*lanes, "env.alfworld.workers=0"], memo=True)
    workers, m, w_workers = _train(tmp_path, [*lanes, "env.alfworld.workers=2"], memo=True)
    assert local[0] == workers[0] and local[2] == workers[2] and local[1] == workers[1]
    assert m["steps"] > 0 and all(torch.equal(w_local[k], w_workers[k]) for k in w_local)
