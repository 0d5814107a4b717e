"""PPO loss on hand-computed numbers, and PPOUpdater / warm start on a real tiny policy."""
from __future__ import annotations

import math
import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState

from envs.base import Observation
from milegpo_cli.policy import Policy, PolicyError
from milegpo_cli.config import PPOConfig
from milegpo_cli.trainer.ppo import PPOConfigError, PPOUpdater, lr_factor, ppo_loss, sample_logprobs
from milegpo_cli.trainer.warmstart import ExpertStep, supervised_warm_start

torch.set_num_threads(1)

TINY = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64, vocab_size=400)
CORPUS = [
    "You arrive at countertop 1. On the countertop 1, you see a apple 1, a knife 2, a mug 3.",
    "Your task is to: put a hot apple in fridge.", "go to fridge 1", "open fridge 1",
    "take apple 1 from countertop 1", "heat apple 1 with microwave 1", "look", "inventory",
]
ADMISSIBLE = ("go to fridge 1", "open fridge 1", "take apple 1 from countertop 1", "look", "inventory",
              "heat apple 1 with microwave 1")
PPO = PPOConfig(lr=3e-3, lr_schedule="constant", warmup_iterations=0, epochs=2, minibatch_size=4, clip=0.2, clip_c=3.0,
           kl_coef=0.0, entropy_coef=0.0, max_grad_norm=1.0, weight_decay=0.0)


def obs(i: int) -> Observation:
    return Observation(f"You arrive at countertop {i}. You see a apple 1.", "Your task is to: put a hot apple in fridge.",
                       ADMISSIBLE, f"s{i}")


@pytest.fixture()
def accelerator():
    AcceleratorState._reset_state(True)
    yield Accelerator(cpu=True)
    AcceleratorState._reset_state(True)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


def policy_of(cache, **kw):
    cfg = dict(model="tiny", action_mode="score", history=2, max_prompt_tokens=128, max_new_tokens=8,
               temperature=1.0, tiny=TINY)
    cfg.update(kw)
    torch.manual_seed(0)
    return Policy.from_config(cfg, CORPUS, cache, "cpu")


def rollout(policy, n=8):
    torch.manual_seed(1)
    return [a.sample for a in policy.act([obs(i) for i in range(n)], [[]] * n, [0] * n)]


def current_logp(policy, samples):
    with torch.no_grad():
        return sample_logprobs(policy.model.eval(), samples, policy.pad_id)[0]


# --- the loss on hand-computed numbers ----------------------------------------------------------

def test_dual_clip_hand_computed():
    ratio = torch.tensor([1.5, 0.5, 1.1, 5.0])
    new = ratio.log().requires_grad_(True)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    loss, stats = ppo_loss(new, torch.zeros(4), adv, clip=0.2, clip_c=3.0)
    # per token: max(-1.5, -1.2) = -1.2 (clipped); max(-0.5, -0.8) = -0.5; 1.1; min(3, max(5, 1.2)) = 3 (dual clip)
    assert float(loss.detach()) == pytest.approx((-1.2 - 0.5 + 1.1 + 3.0) / 4, abs=1e-6)
    assert float(stats["clip_frac"]) == pytest.approx(0.25) and float(stats["clip_frac_lower"]) == pytest.approx(0.25)
    assert float(stats["approx_kl"]) == pytest.approx(float((ratio - 1 - ratio.log()).mean()), abs=1e-6)  # k3
    loss.backward()
    # d/dlogp of -A r is -A r / 4 where not clipped; 0 where clipped (token 0) or dual-clipped (token 3)
    assert torch.allclose(new.grad, torch.tensor([0.0, -0.5 / 4, 1.1 / 4, 0.0]), atol=1e-6)


def test_kl_and_entropy_terms():
    new, old, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    d = ref - new
    k3 = (d.exp() - d - 1).mean()
    base, _ = ppo_loss(new, old, torch.tensor([1.0, 1.0]))
    loss, stats = ppo_loss(new, old, torch.tensor([1.0, 1.0]), ref_logp=ref, kl_coef=0.1,
                           entropy=torch.tensor([2.0, 4.0]), entropy_coef=0.01)
    assert float(stats["kl"]) == pytest.approx(float(k3), abs=1e-6) and float(stats["entropy"]) == pytest.approx(3.0)
    assert float(loss) == pytest.approx(float(base) + 0.1 * float(k3) - 0.01 * 3.0, abs=1e-6)
    half, _ = ppo_loss(new, old, torch.tensor([1.0, 1.0]), norm=4)  # micro-batch share of a 4-token minibatch
    assert float(half) == pytest.approx(float(base) / 2)


def test_lr_schedules():
    f = lr_factor("linear", 2, 10)
    assert [round(f(i), 4) for i in (0, 1, 2, 6, 10)] == [round(1 / 3, 4), round(2 / 3, 4), 1.0, 0.5, 0.0]
    c = lr_factor("cosine", 0, 4)
    assert c(0) == pytest.approx(1.0) and c(2) == pytest.approx(0.5) and c(4) == pytest.approx(0.0, abs=1e-12)
    assert lr_factor("constant", 0, None)(100) == 1.0
    with pytest.raises(PPOConfigError, match="lr_schedule"):
        lr_factor("step", 0, 10)
    with pytest.raises(PPOConfigError, match="total"):
        lr_factor("cosine", 0, None)


# --- the updater on a real policy ---------------------------------------------------------------

@pytest.mark.parametrize("mode", ["score", "generate"])
def test_loss_decreases_on_fixed_batch(cache, accelerator, mode):
    policy = policy_of(cache, action_mode=mode)
    samples = rollout(policy)
    adv = np.array([1.0, -1.0] * 4)
    updater = PPOUpdater(policy, PPO, accelerator)
    before = current_logp(policy, samples)
    losses = [updater.update(samples, adv)["policy_loss"] for _ in range(4)]
    after = current_logp(policy, samples)
    assert losses[-1] < losses[0], losses
    rows = sample_logprobs(policy.model, samples, policy.pad_id)[2]  # token -> sample
    gain = (after - before).double()
    sign = torch.as_tensor(adv)[rows]
    assert float((gain * sign).sum()) > 0  # positive-advantage actions became likelier, negative ones less


def test_update_metrics_and_skip_on_nan(cache, accelerator):
    policy = policy_of(cache)
    samples = rollout(policy)
    updater = PPOUpdater(policy, replace(PPO, entropy_coef=0.01), accelerator)
    m = updater.update(samples, np.linspace(-1, 1, len(samples)))
    for key in ("policy_loss", "kl", "entropy", "clip_frac", "grad_norm", "approx_kl", "tokens", "skipped", "lr"):
        assert key in m
    assert m["skipped"] is False and m["optimizer_steps"] == 4 and m["tokens"] > 0 and m["entropy"] > 0
    assert 0 <= m["approx_kl"] < 0.5  # first epoch at ratio 1: rollout and update log-probs agree
    weights = [p.detach().clone() for p in policy.model.parameters()]
    bad = np.ones(len(samples))
    bad[3] = np.nan
    m = updater.update(samples, bad)
    assert m["skipped"] is True and m["optimizer_steps"] == 0
    assert all(torch.equal(w, p) for w, p in zip(weights, policy.model.parameters()))
    with pytest.raises(PPOConfigError, match="advantages"):
        updater.update(samples, np.ones(3))


def test_no_advantage_signal_takes_no_step(cache, accelerator):
    """All-zero advantages: the entropy bonus alone would move the weights at Adam's full step;
    the update is skipped, the lr schedule advances, and it is not a failed update. With a KL
    term the same batch still updates (the pull toward the reference is signal)."""
    policy = policy_of(cache)
    samples = rollout(policy)
    cfg = replace(PPO, entropy_coef=0.01, lr_schedule="linear")
    updater = PPOUpdater(policy, cfg, accelerator, total_updates=4)
    weights = [p.detach().clone() for p in policy.model.parameters()]
    lr = updater.scheduler.get_last_lr()[0]
    with warnings.catch_warnings(record=True) as caught:  # a deliberate skip: torch's order warning is silenced
        warnings.simplefilter("always")
        m = updater.update(samples, np.zeros(len(samples)))
    assert not [w for w in caught if "lr_scheduler" in str(w.message)]
    assert m["optimizer_steps"] == 0 and m["no_signal"] == 1.0 and m["skipped"] is False
    assert m["adv_zero_share"] == 1.0 and "advantage signal" in m["skipped_reason"]
    assert all(torch.equal(w, p) for w, p in zip(weights, policy.model.parameters()))
    assert updater.updates == 1 and updater.scheduler.get_last_lr()[0] < lr
    # one nonzero advantage is signal: the update steps
    adv = np.zeros(len(samples))
    adv[0] = 1.0
    assert updater.update(samples, adv)["optimizer_steps"] > 0
    kl = PPOUpdater(policy, replace(cfg, kl_coef=0.1), accelerator, total_updates=4)
    assert kl.update(samples, np.zeros(len(samples)))["optimizer_steps"] > 0


def test_state_dict_round_trip(cache, accelerator):
    policy = policy_of(cache)
    samples = rollout(policy)
    cfg = replace(PPO, lr_schedule="linear", warmup_iterations=1)
    updater = PPOUpdater(policy, cfg, accelerator, total_updates=5)
    updater.update(samples, np.ones(len(samples)))
    state = updater.state_dict()
    other = PPOUpdater(policy_of(cache), cfg, accelerator, total_updates=5)
    other.load_state_dict(state)
    assert other.updates == 1 and other.scheduler.get_last_lr() == updater.scheduler.get_last_lr()
    a, b = updater.optimizer.state_dict()["state"], other.optimizer.state_dict()["state"]
    assert a.keys() == b.keys() and all(torch.equal(a[k]["exp_avg"], b[k]["exp_avg"]) for k in a)


def test_lora_reference_is_base_before_and_differs_after(cache, accelerator):
    policy = policy_of(cache, lora=True, lora_r=4, lora_alpha=8, lora_dropout=0.0, lora_targets=["q_proj", "v_proj"])
    samples = rollout(policy)
    base = current_logp(policy, samples)
    with torch.no_grad(), policy.reference() as ref:
        ref_before = sample_logprobs(ref, samples, policy.pad_id)[0]
    assert torch.equal(ref_before, base)  # LoRA B starts at 0: policy == reference
    updater = PPOUpdater(policy, replace(PPO, kl_coef=0.05), accelerator)
    m = updater.update(samples, np.array([1.0, -1.0] * 4))
    assert m["kl"] >= 0
    trained = current_logp(policy, samples)
    with torch.no_grad(), policy.reference() as ref:
        ref_after = sample_logprobs(ref.eval(), samples, policy.pad_id)[0]
    assert not torch.allclose(trained, ref_after, atol=1e-4)
    assert torch.allclose(ref_after, base, atol=1e-6)  # the reference did not move


def test_full_finetune_kl_uses_frozen_copy(cache, accelerator):
    policy = policy_of(cache)
    samples = rollout(policy)
    base = current_logp(policy, samples)
    updater = PPOUpdater(policy, replace(PPO, kl_coef=0.1), accelerator)
    assert policy.ref_model is not None
    updater.update(samples, np.array([1.0, -1.0] * 4))
    with torch.no_grad(), policy.reference() as ref:
        assert torch.allclose(sample_logprobs(ref, samples, policy.pad_id)[0], base, atol=1e-6)


@pytest.mark.parametrize("mode", ["score", "generate"])
def test_warm_start_learns_expert_actions(cache, mode):
    policy = policy_of(cache, action_mode=mode)
    experts = [ExpertStep(obs(i), (), 0, ADMISSIBLE[i % 3]) for i in range(6)]
    m = supervised_warm_start(policy, experts, epochs=6, lr=1e-2, minibatch_size=3)
    assert m["warmstart_loss_last_epoch"] < m["warmstart_loss_first_epoch"]
    if mode == "score":
        assert m["warmstart_accuracy"] > 1 / len(ADMISSIBLE)
        with pytest.raises(PolicyError, match="not admissible"):
            supervised_warm_start(policy, [ExpertStep(obs(0), (), 0, "fly away")], 1, 1e-3)
    assert math.isfinite(m["warmstart_time_s"])


def test_length_sorted_micro_batches_give_the_whole_minibatch_update(cache, accelerator):
    """ppo.micro_batch_size: a minibatch's steps sorted by length into micro-batches (gradients
    accumulated over the minibatch) take the same optimizer step as one batch of them all."""
    histories = [[("You see a fridge 1.", "look")] * (i % 4) for i in range(8)]
    weights = []
    for micro in (0, 2):
        policy = policy_of(cache)
        torch.manual_seed(1)
        samples = [a.sample for a in policy.act([obs(i) for i in range(8)], histories, [len(h) for h in histories])]
        assert len({s.num_tokens for s in samples}) > 2
        torch.manual_seed(2)
        m = PPOUpdater(policy, replace(PPO, micro_batch_size=micro), accelerator).update(samples, np.linspace(-1, 1, 8))
        assert m["optimizer_steps"] == 4
        weights.append([p.detach().clone() for p in policy.model.parameters()])
    assert all(torch.allclose(a, b, rtol=0.0, atol=1e-5) for a, b in zip(*weights))
    assert any(not torch.equal(a, b) for a, b in zip(weights[0], policy_of(cache).model.parameters()))  # it moved


@pytest.mark.parametrize("mode", ["score", "generate"])
def test_reference_pass_scores_each_distinct_sample_once_sorted_by_length(cache, accelerator, mode, monkeypatch):
    """The KL reference pass: the same log-probs as one sample at a time, each distinct sample
    scored once, micro-batches in length order."""
    policy = policy_of(cache, action_mode=mode)
    histories = [[("You see a fridge 1.", "look")] * (i % 3) for i in range(6)]
    torch.manual_seed(1)
    samples = [a.sample for a in policy.act([obs(i % 4) for i in range(6)], histories, [len(h) for h in histories])]
    samples = samples + samples[:3]  # duplicates, as the rollouts of a group at a shared state
    updater = PPOUpdater(policy, replace(PPO, kl_coef=0.1, micro_batch_size=2), accelerator)
    with torch.no_grad(), policy.reference() as ref:
        one_by_one = [sample_logprobs(ref, [s], policy.pad_id)[0] for s in samples]
    import milegpo_cli.trainer.ppo as ppo

    seen = []
    real = ppo.sample_logprobs
    monkeypatch.setattr(ppo, "sample_logprobs", lambda m, chunk, pad: seen.append(chunk) or real(m, chunk, pad))
    refs = updater.reference_logprobs(samples)
    assert len(refs) == len(samples)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(refs, one_by_one))
    scored = [s for chunk in seen for s in chunk]
    assert len(scored) == len({ppo.sample_key(s) for s in samples}) < len(samples)
    assert [s.num_tokens for s in scored] == sorted(s.num_tokens for s in scored)


@pytest.mark.parametrize("mode", ["score", "generate"])
def test_micro_batches_on_a_thread_pool_give_the_serial_update(cache, accelerator, mode, monkeypatch):
    """With two torch threads the update runs a minibatch's micro-batches (and the reference pass)
    on two pool threads of one intra-op thread each, summing their gradients in micro-batch order:
    the same bits as the serial one-thread update, so the result does not depend on the threads."""
    import threading

    import milegpo_cli.trainer.ppo as ppo

    histories = [[("You see a fridge 1.", "look")] * (i % 4) for i in range(8)]
    threads_seen = set()
    real = ppo.sample_logprobs
    monkeypatch.setattr(ppo, "sample_logprobs",
                        lambda m, chunk, pad: threads_seen.add(threading.current_thread().name) or real(m, chunk, pad))
    runs = []
    try:
        for threads in (1, 2, 2):
            torch.set_num_threads(threads)
            policy = policy_of(cache, action_mode=mode)
            torch.manual_seed(1)
            samples = [a.sample for a in policy.act([obs(i) for i in range(8)], histories, [len(h) for h in histories])]
            torch.manual_seed(2)
            updater = PPOUpdater(policy, replace(PPO, kl_coef=0.1, micro_batch_size=1), accelerator)
            assert ppo.pool_workers(accelerator, updater.model, None) == threads
            m = updater.update(samples, np.linspace(-1, 1, 8))
            runs.append(([p.detach().clone() for p in policy.model.parameters()], m))
    finally:
        torch.set_num_threads(1)
    assert any(name.startswith("ppo-micro") for name in threads_seen) and "MainThread" in threads_seen
    (serial, m1), (pooled, m2), (again, _) = runs
    assert m1["optimizer_steps"] == m2["optimizer_steps"] == 4 and m1["tokens"] == m2["tokens"]
    assert all(abs(m1[k] - m2[k]) < 1e-6 for k in ("approx_kl", "kl", "policy_loss", "entropy", "grad_norm"))
    assert all(torch.equal(a, b) for a, b in zip(serial, pooled))
    assert all(torch.equal(a, b) for a, b in zip(pooled, again))  # no race in the sums
    assert any(not torch.equal(a, b) for a, b in zip(serial, policy_of(cache, action_mode=mode).model.parameters()))


def test_pool_threads_follow_the_process_cores_not_other_processes_load(cache, accelerator, monkeypatch):
    """The update's pool threads: run.threads capped by the member share (MILEGPO_CORES) and the
    affinity mask, not by torch's load-following intra-op count (one thread beside a busy neighbour)."""
    import os

    import milegpo_cli.trainer.ppo as ppo

    updater = PPOUpdater(policy_of(cache), PPO, accelerator, threads=2)
    assert torch.get_num_threads() == 1  # as the trainer sets it beside a CPU-bound neighbour
    monkeypatch.setenv("MILEGPO_CORES", "1")
    assert ppo.pool_workers(accelerator, updater.model, 2) == 1
    monkeypatch.setenv("MILEGPO_CORES", "2")
    assert ppo.pool_workers(accelerator, updater.model, 2) == min(2, len(os.sched_getaffinity(0)))
    assert ppo.pool_workers(accelerator, updater.model, 1) == 1
