"""What learning needs (issue 13): disjoint task pools, the cached base policy, evaluation phases and
the probe, PPO's early stop / advantage normalisation / loss weights, the LoRA KL reference after a
warm start, Wilson intervals, plain log lines off a terminal."""
from __future__ import annotations

import dataclasses
import io
import json
import math

import numpy as np
import pytest
import torch
from rich.console import Console

from milegpo_cli.config import PPOConfig
from milegpo_cli.store import RunStore
from milegpo_cli.trainer import loop, builders, rollout as trainer_rollout
from milegpo_cli.trainer.base_policy import base_fingerprint, base_policy_dir, build_base_policy, ensure_base_policy
from milegpo_cli.intervals import wilson_interval
from milegpo_cli.trainer.evaluation import PROBE_STATE_LOGPS, eval_tasks
from milegpo_cli.trainer.ppo import PPOUpdater, normalise_advantages, ppo_loss, sample_logprobs
from milegpo_cli.trainer.task_pools import base_tasks, ppo_pool, warmstart_tasks
from test_trainer import make_config, quiet

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


def test_task_pools_are_disjoint_and_drawn_by_the_seed(tmp_path, models_dir):
    config = make_config("webshop", tmp_path, models_dir, "env.webshop.train_instructions=400")
    suite = builders.build_suite(config)
    ids = lambda tasks: {t.task_id for t in tasks}  # noqa: E731
    seed0, seed1 = ids(ppo_pool(suite, 16, seed=0)), ids(ppo_pool(suite, 16, seed=1))
    warm, base = ids(warmstart_tasks(suite, 40, seed=0)), ids(base_tasks(suite, 40))
    evals = ids(eval_tasks(suite, "id", 8)) | ids(eval_tasks(suite, "ood", 8))
    assert len(seed0) == len(seed1) == 16 and not seed0 & seed1
    for a, b in ((seed0, warm), (seed0, base), (warm, base), (seed0 | seed1 | warm | base, evals)):
        assert not a & b
    assert ids(ppo_pool(suite, 16, seed=0)) == seed0  # a pure function of the seed


def test_wilson_interval_matches_the_closed_form():
    lo, hi = wilson_interval(10, 100)
    assert lo == pytest.approx(0.0552, abs=1e-4) and hi == pytest.approx(0.1744, abs=1e-4)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == pytest.approx(1.0)


def test_advantage_normalisation():
    adv = np.array([0.0, 0.0, 2.0, -1.0])
    scaled = normalise_advantages(adv, "scale")
    assert scaled[0] == 0.0 and scaled.std() == pytest.approx(1.0)
    white = normalise_advantages(adv, "whiten")
    assert white.mean() == pytest.approx(0.0) and white.std() == pytest.approx(1.0)
    assert np.array_equal(normalise_advantages(np.zeros(3), "whiten"), np.zeros(3))  # no 0/0


def test_loss_weights_give_each_episode_equal_weight():
    new = torch.zeros(3, requires_grad=True)
    adv = torch.tensor([1.0, 1.0, -1.0])  # a 2-step episode of +1 and a 1-step episode of -1
    token_mean, _ = ppo_loss(new, torch.zeros(3), adv)
    episode_mean, _ = ppo_loss(new, torch.zeros(3), adv, weights=torch.tensor([0.5, 0.5, 1.0]))
    assert float(token_mean.detach()) == pytest.approx(-1 / 3) and float(episode_mean.detach()) == pytest.approx(0.0)


@pytest.mark.slow
def test_target_kl_stops_the_update_early(tmp_path, models_dir):
    config = make_config("webshop", tmp_path, models_dir, "rollout.groups=2", "rollout.group_size=4")
    suite = builders.build_suite(config)
    policy = builders.build_policy(config, suite, "cpu")
    venv = suite.make_vector_env(8)
    episodes = trainer_rollout.run_episodes(policy, venv, ppo_pool(suite, 2, 0), 4, max_steps=4, success_reward=10,
                                 invalid_penalty=0.1)
    samples = [s for e in episodes for s in e.samples]
    adv = np.where(np.arange(len(samples)) % 2 == 0, 5.0, -5.0)
    strong = PPOConfig(lr=5e-2, epochs=8, minibatch_size=2)
    free = PPOUpdater(policy, strong).update(samples, adv)
    policy2 = builders.build_policy(config, suite, "cpu")
    guarded = PPOUpdater(policy2, dataclasses.replace(strong, target_kl=1e-3)).update(samples, adv)
    assert free["early_stopped"] == 0.0 and guarded["early_stopped"] == 1.0
    assert 1 <= guarded["optimizer_steps"] < free["optimizer_steps"]
    for key in ("grad_norm", "grad_norm_max", "clip_frac", "approx_kl", "entropy", "adv_mean", "adv_std",
                "adv_zero_share"):
        assert math.isfinite(guarded[key]), key


@pytest.mark.slow
def test_lora_kl_reference_is_the_warm_started_policy(tmp_path, models_dir):
    config = make_config("webshop", tmp_path, models_dir, "policy.lora=true", "policy.lora_r=4",
                         "policy.lora_targets=['q_proj','v_proj','o_proj','up_proj']",
                         "warmstart.episodes=6", "warmstart.epochs=3", "warmstart.lr=3e-2")
    suite = builders.build_suite(config)
    policy = builders.build_policy(config, suite, "cpu")
    loop.warm_start(config, policy, suite)
    episodes = trainer_rollout.run_episodes(policy, suite.make_vector_env(4), ppo_pool(suite, 2, 0), 2, max_steps=4,
                                 success_reward=10, invalid_penalty=0.1)
    probe = [s for e in episodes for s in e.samples if len(s.candidate_ids) > 1]
    assert probe

    def logps(model):
        with torch.no_grad():
            return sample_logprobs(model, probe, policy.pad_id)[0]

    with policy.reference() as ref:
        before = logps(ref)  # adapter disabled: the model before the warm start
    warmed = logps(policy.model)
    assert not torch.allclose(before, warmed, atol=1e-4)
    policy.rebase(tmp_path / "ws_base")
    with policy.reference() as ref:
        assert torch.allclose(logps(ref), warmed, atol=1e-5)
    assert torch.allclose(logps(policy.model), warmed, atol=1e-5)  # a fresh adapter changes nothing


@pytest.mark.slow
def test_base_policy_does_not_depend_on_the_callers_rng_or_threads_only_on_its_seed(tmp_path, models_dir):
    from milegpo_cli.policy import Policy

    config = make_config("webshop", tmp_path, models_dir, "base.enabled=true", "base.walkthroughs=4", "base.epochs=1")
    reseeded = dataclasses.replace(config, base=dataclasses.replace(config.base, seed=1))
    suite = builders.build_suite(config)
    weights = []
    try:
        for cfg, seed, threads in ((config, 1, 1), (config, 2, 2), (reseeded, 1, 1)):
            torch.manual_seed(seed)
            torch.set_num_threads(threads)
            before = torch.get_rng_state()
            policy = Policy.from_config(cfg.policy, suite.text_corpus(), cache_dir=models_dir, device="cpu")
            build_base_policy(cfg, suite, policy, log=lambda *_: None)
            assert torch.equal(torch.get_rng_state(), before)  # the caller's RNG is left as it was
            assert torch.get_num_threads() == threads  # and its thread count
            weights.append({k: v.clone() for k, v in policy.model.state_dict().items()})
    finally:
        torch.set_num_threads(1)
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert not all(torch.equal(weights[0][k], weights[2][k]) for k in weights[0])  # base.seed: another base
    # another seed is another version; seed 0 hashes as before the field existed (cached bases stay valid)
    assert base_policy_dir(reseeded, "x") != base_policy_dir(config, "x")
    assert "seed" not in base_fingerprint(config.base)


def test_base_policy_is_built_once_and_ppo_starts_from_it(tmp_path, models_dir):
    extra = ["base.enabled=true", "base.walkthroughs=6", "base.epochs=2", "run.iterations=1", "eval.every=1",
             "checkpoint.every=1", "eval.untrained=true"]
    config = make_config("webshop", tmp_path, models_dir, *extra)
    suite = builders.build_suite(config)
    lines: list[str] = []
    folder = ensure_base_policy(config, suite, "cpu", log=lines.append)
    assert any("expert walkthroughs 6/6" in line for line in lines)  # progress of a long build
    assert sum("supervised epoch" in line for line in lines) == 2
    built = (folder / "model").stat().st_mtime_ns
    assert ensure_base_policy(config, suite, "cpu", log=lambda *_: None) == folder  # cached
    assert (folder / "model").stat().st_mtime_ns == built
    other = make_config("webshop", tmp_path, models_dir, *extra[:-1], "base.epochs=3")
    assert base_policy_dir(other, "x") != base_policy_dir(config, "x")  # versioned by its recipe
    runtime = make_config("webshop", tmp_path, models_dir, *extra, 'env.oracle="off"', "env.webshop.step_timeout_s=5")
    assert base_policy_dir(runtime, "x") == base_policy_dir(config, "x")  # how steps run does not shape it

    out = io.StringIO()
    store = RunStore(config.store.db)
    run_id = loop.train(config, store, config.store.mlflow_uri, console=Console(file=out, width=80))
    phases = [(e["iteration"], e["phase"]) for e in store.evaluations(run_id)]
    assert phases == [(0, "untrained"), (0, "warmstart"), (1, "train")]
    its = store.iterations(run_id)
    assert its[0]["metrics"]["base_walkthroughs"] == 6 and "probe_expert_logp_id" in its[1]["metrics"]
    evals = {e["phase"]: e for e in store.evaluations(run_id)}
    assert evals["warmstart"]["metrics"]["probe_expert_logp"] > evals["untrained"]["metrics"]["probe_expert_logp"]
    states = evals["warmstart"]["metrics"][PROBE_STATE_LOGPS]  # per state, for paired probe gains
    assert len(states) == len(evals["train"]["metrics"][PROBE_STATE_LOGPS]) > 1
    assert abs(sum(states) / len(states) - evals["warmstart"]["metrics"]["probe_expert_logp"]) < 1e-4
    assert not any(k.startswith(PROBE_STATE_LOGPS) for k in its[1]["metrics"])  # iteration metrics stay scalar
    log = out.getvalue()
    assert "iteration 1/1: success" in log and "approx_kl" in log  # plain lines: not a terminal
    assert "eval warmstart (iteration 0) id: success" in log
    assert json.loads(json.dumps(its[0]["metrics"]))  # stored metrics are plain JSON


def test_evaluation_and_probe_do_not_depend_on_the_group_layout(tmp_path, models_dir):
    start = {}
    for groups in (2, 3):
        config = make_config("webshop", tmp_path / f"g{groups}", models_dir, f"rollout.groups={groups}",
                             "eval.episodes=8", "eval.probe_states=20", "run.iterations=1", "eval.every=1")
        store = RunStore(config.store.db)
        run_id = loop.train(config, store, config.store.mlflow_uri, console=quiet())
        (first,) = [e for e in store.evaluations(run_id) if e["phase"] == "warmstart"]
        start[groups] = (first["success_rate"], first["metrics"]["probe_expert_logp"],
                         [(e["task_id"], e["outcome"], e["length"]) for e in store.episodes(run_id, evaluation_id=first["id"])])
    assert start[2] == start[3]


def test_probe_leaves_out_the_experts_no_op_steps(tmp_path, models_dir):
    pytest.importorskip("alfworld")
    from milegpo_cli.trainer.evaluation import Probe
    from milegpo_cli.trainer.rollout import expert_walkthroughs

    config = make_config("alfworld", tmp_path, models_dir)
    suite = builders.build_suite(config)
    venv = suite.make_vector_env(4, oracle=True)
    try:  # the handcoded expert opens every walkthrough with "look", which changes nothing
        raw = expert_walkthroughs(venv, eval_tasks(suite, "id", 4), suite.max_steps)[0]
    finally:
        venv.close()
    assert [s.action for s in raw if s.steps_taken == 0] == ["look"] * 4
    probe = Probe.collect(suite, ["id"], 6, 8, 4)
    assert len(probe.steps["id"]) == 8  # still exactly probe_states states
    assert all(s.action not in suite.no_op_commands for s in probe.steps["id"])
