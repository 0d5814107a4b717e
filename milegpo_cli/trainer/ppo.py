"""PPO update of the policy (docs/architecture.md "Policy and loss"; settings: docs/learning.md).

Loss per token (generate mode: every reply token; score mode: one "token" per step, the chosen
command under the candidate softmax), with r = exp(logp - logp_old) and advantage A:

    L_clip = max(-A r, -A clip(r, 1 - eps, 1 + eps))          (PPO-clip)
    L_pg   = min(L_clip, -A c)   if A < 0   else L_clip        (dual-clip, c = clip_c = 3)
    KL     = exp(ref - logp) - (ref - logp) - 1                (k3, "low_var_kl"; clamped to [-10, 10])
    L      = mean(L_pg) + kl_coef * mean(KL) - entropy_coef * mean(H)

means taken over all tokens of a minibatch ("token-mean", verl's default aggregation), or weighted
means with per-token weights w (``ppo.loss_agg``): "sequence-mean" weights each of a reply's tokens
1 / len(reply) (each step counts once), "episode-mean" weights each step of an episode 1 / T (each
episode counts once, so long failed episodes do not dominate).

approx_kl = mean((r - 1) - log r) (the k3 estimator, >= 0, as Stable-Baselines3); with
``ppo.target_kl`` > 0 the update stops before the step of the first minibatch whose approx_kl
exceeds 1.5 x target_kl (SB3's early stopping), so one bad iteration cannot wreck the policy.
Advantages may be normalised over the batch first (``ppo.advantage_norm``): "scale" divides by
their standard deviation (zeros stay zero), "whiten" also subtracts their mean. A batch whose
advantages are all 0 (no group had a better or worse rollout) takes no optimizer step when
kl_coef = 0: its loss would be -entropy_coef * H alone, and Adam's scale-free steps would carry the
policy toward uniform at the full learning rate (measured: a GiGPO run whose PPO pool failed for
14 of 16 iterations fell from 15 % to 0 % held-out success this way; docs/learning.md).
"""
from __future__ import annotations

import contextlib
import math
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from typing import Any, Sequence

import numpy as np
import torch
from torch.optim.lr_scheduler import LambdaLR

from envs.faults import fault_point
from milegpo_cli import cores
from milegpo_cli.config import PPOConfig
from milegpo_cli.errors import MilegpoError
from milegpo_cli.trainer.distributed import any_rank, minibatches, prepare, sync_gradients
from milegpo_cli.policy.actions import (GenerateSample, ScoreSample, generate_sample_logprobs,
                                        score_sample_logprobs)

SCHEDULES = ("constant", "linear", "cosine")


class PPOConfigError(MilegpoError, ValueError):
    """Bad [ppo] setting or bad input to the update."""


def ppo_loss(new_logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, *,
             clip: float = 0.2, clip_c: float = 3.0, ref_logp: torch.Tensor | None = None, kl_coef: float = 0.0,
             entropy: torch.Tensor | None = None, entropy_coef: float = 0.0,
             norm: float | None = None, weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Dual-clip PPO loss of the module docstring over flat per-token tensors, each token weighted by
    ``weights`` (default 1). ``norm`` is the denominator of the weighted mean (default: the sum of the
    weights here; pass the minibatch total when accumulating micro-batches). Returns (loss, stats);
    stats are detached unweighted means over these tokens."""
    w = torch.ones_like(new_logp) if weights is None else weights
    denom = float(norm if norm is not None else w.sum())
    log_ratio = (new_logp - old_logp).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    loss1 = -advantages * ratio
    loss2 = -advantages * ratio.clamp(1.0 - clip, 1.0 + clip)
    clipped = torch.maximum(loss1, loss2)
    loss3 = -advantages * clip_c
    pg = torch.where(advantages < 0, torch.minimum(loss3, clipped), clipped)
    loss = (w * pg).sum() / denom
    stats = {
        "policy_loss": pg.detach().mean(),
        "clip_frac": (loss2 > loss1).float().mean(),
        "clip_frac_lower": ((clipped > loss3) & (advantages < 0)).float().mean(),
        "approx_kl": ((ratio - 1.0) - log_ratio).detach().mean(),
    }
    if ref_logp is not None:
        d = (ref_logp - new_logp).clamp(-20.0, 20.0)
        kl = (d.exp() - d - 1.0).clamp(-10.0, 10.0)
        if kl_coef:
            loss = loss + kl_coef * (w * kl).sum() / denom
        stats["kl"] = kl.detach().mean()
    if entropy is not None:
        if entropy_coef:
            loss = loss - entropy_coef * (w * entropy).sum() / denom
        stats["entropy"] = entropy.detach().mean()
    return loss, stats


def lr_factor(schedule: str, warmup: int, total: int | None):
    """Multiplier of the base lr after ``i`` updates: linear warmup over ``warmup`` updates, then
    constant, linear decay to 0, or cosine decay to 0 at ``total``."""
    if schedule not in SCHEDULES:
        raise PPOConfigError(f"ppo.lr_schedule: unknown schedule {schedule!r} (allowed: {', '.join(SCHEDULES)})")
    if schedule != "constant" and not total:
        raise PPOConfigError(f"ppo.lr_schedule = {schedule!r} needs the total number of updates (run.iterations)")

    def factor(i: int) -> float:
        if i < warmup:
            return (i + 1) / (warmup + 1)
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (i - warmup) / max(1, total - warmup))
        return 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def sample_logprobs(model, samples: Sequence, pad_id: int):
    """(new logp, entropy, row) flat over the tokens of ``samples``; row = index into ``samples``."""
    if isinstance(samples[0], ScoreSample):
        logp, ent = score_sample_logprobs(model, samples, pad_id)
        return logp, ent, torch.arange(len(samples), device=logp.device)
    return generate_sample_logprobs(model, samples, pad_id, with_entropy=True)


def old_logprobs(samples: Sequence, device) -> torch.Tensor:
    if isinstance(samples[0], ScoreSample):
        return torch.tensor([s.old_logp for s in samples], dtype=torch.float32, device=device)
    return torch.tensor([x for s in samples for x in s.old_logps], dtype=torch.float32, device=device)


def sample_key(s) -> tuple:
    """What a sample's log-probs depend on: equal keys, equal log-probs."""
    if isinstance(s, ScoreSample):
        return (tuple(s.prompt_ids), tuple(map(tuple, s.candidate_ids)), s.chosen, s.temperature, s.length_norm)
    return (tuple(s.prompt_ids), tuple(s.response_ids), s.temperature)


def num_loss_tokens(samples: Sequence) -> int:
    return len(samples) if isinstance(samples[0], ScoreSample) else sum(len(s.response_ids) for s in samples)


def normalise_advantages(adv: np.ndarray, mode: str, eps: float = 1e-8) -> np.ndarray:
    """``ppo.advantage_norm`` over the batch: "none", "scale" (A / std) or "whiten" ((A - mean) / std)."""
    if mode == "none" or adv.size < 2:
        return adv
    std = float(adv.std())
    if std < eps:
        return adv - adv.mean() if mode == "whiten" else adv
    return (adv - adv.mean()) / std if mode == "whiten" else adv / std


def token_weights(samples: Sequence, sample_weights: np.ndarray, loss_agg: str) -> list[torch.Tensor]:
    """Per-token loss weights of each sample: its sample weight, divided by the reply length for
    "sequence-mean" in generate mode (score mode has one loss token per step)."""
    out = []
    for s, w in zip(samples, sample_weights):
        n = 1 if isinstance(s, ScoreSample) else len(s.response_ids)
        out.append(torch.full((n,), float(w) / (n if loss_agg == "sequence-mean" else 1), dtype=torch.float32))
    return out


@dataclass
class MicroBatch:
    """A micro-batch's forward pass: its loss, stats and, when run in the pool, its gradients."""

    loss: torch.Tensor
    stats: dict[str, torch.Tensor]
    n: int  # loss tokens
    tokens: int  # model tokens
    grads: list[torch.Tensor | None] | None = None


def pool_workers(accelerator, model, threads: int | None) -> int:
    """Threads that run a minibatch's micro-batches at once, each with one intra-op torch thread, for a
    single CPU process without mixed precision or dropout (else 1: accelerate's backward and
    collectives stay on the calling thread): ``threads`` capped by the process's cores (affinity,
    cgroup quota, ``ablate``'s member share) but not by other processes' load, or torch's thread
    count when ``threads`` is None. Independent micro-batches keep a core busy between one join per
    minibatch, where intra-op threads of the tiny model's small matrices wait for each other at every
    operation; so a pool thread whose core is shared slows only its own micro-batch, and the second
    thread still brings more than it costs (docs/performance.md)."""
    cfg = getattr(model, "config", None)
    if (accelerator.num_processes > 1 or accelerator.device.type != "cpu" or str(accelerator.mixed_precision) != "no"
            or float(getattr(cfg, "attention_dropout", 0.0) or 0.0) > 0):
        return 1
    return max(1, min(threads, cores.process_cores()) if threads else torch.get_num_threads())


@contextlib.contextmanager
def micro_batch_pool(workers: int):
    """A pool of ``workers`` threads, torch at one intra-op thread meanwhile (new threads take that
    count); None for one worker (micro-batches run on the calling thread)."""
    if workers <= 1:
        yield None
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="ppo-micro") as pool:
            yield pool
    finally:
        torch.set_num_threads(before)


def add_grads(total: list[torch.Tensor | None] | None, grads: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """Gradient accumulation in micro-batch order (the same sums as ``backward`` into ``.grad``)."""
    if total is None:
        return list(grads)
    return [g if t is None else t if g is None else t.add_(g) for t, g in zip(total, grads)]


class PPOUpdater:
    """Epochs x minibatches of the dual-clip PPO loss through ``accelerate`` (device placement,
    mixed precision, DDP), AdamW, gradient clipping and a per-update LR schedule."""

    def __init__(self, policy, ppo: PPOConfig, accelerator=None, total_updates: int | None = None,
                 threads: int | None = None):
        """``ppo``: the run's validated ``[ppo]`` section (config.py); ``total_updates``: run.iterations."""
        from accelerate import Accelerator

        self.policy = policy
        self.accelerator = accelerator if accelerator is not None else Accelerator()
        self.lr, self.epochs, self.minibatch_size = ppo.lr, ppo.epochs, ppo.minibatch_size
        self.micro_batch_size = ppo.micro_batch_size or ppo.minibatch_size  # 0: the whole minibatch
        self.clip, self.clip_c, self.kl_coef, self.entropy_coef = ppo.clip, ppo.clip_c, ppo.kl_coef, ppo.entropy_coef
        self.max_grad_norm, self.target_kl = ppo.max_grad_norm, ppo.target_kl
        self.advantage_norm, self.loss_agg = ppo.advantage_norm, ppo.loss_agg
        factor = lr_factor(ppo.lr_schedule, ppo.warmup_iterations, total_updates)
        if self.kl_coef > 0:
            policy.ensure_reference()
            if policy.ref_model is not None:
                policy.ref_model.to(self.accelerator.device)
        self.params = [p for p in policy.model.parameters() if p.requires_grad]
        if not self.params:
            raise PPOConfigError("ppo: the policy has no trainable parameters")
        optimizer = torch.optim.AdamW(self.params, lr=self.lr, weight_decay=ppo.weight_decay)
        self.model, self.optimizer = prepare(self.accelerator, policy.model, optimizer)
        self.scheduler = LambdaLR(self.optimizer.optimizer if hasattr(self.optimizer, "optimizer") else self.optimizer,
                                  factor)
        self.updates = 0
        self.threads = threads  # pool threads of an update (:func:`pool_workers`)

    def reference_logprobs(self, samples: Sequence, pool: ThreadPoolExecutor | None = None) -> list[torch.Tensor]:
        """Per-sample reference log-probs (adapter disabled / frozen copy), computed once per update:
        each distinct sample once (rollouts of a group share states), in micro-batches of similar
        lengths (little padding), spread over ``pool``'s threads when given."""
        keys = [sample_key(s) for s in samples]
        first: dict = {}
        for i, key in enumerate(keys):
            first.setdefault(key, i)
        order = sorted(first.values(), key=lambda i: samples[i].num_tokens)
        chunks = [order[k:k + self.micro_batch_size] for k in range(0, len(order), self.micro_batch_size)]

        def score(ref, idx: list[int]) -> list[torch.Tensor]:
            with torch.no_grad(), self.accelerator.autocast():  # grad mode and autocast are per thread
                logp, _, row = sample_logprobs(ref, [samples[i] for i in idx], self.policy.pad_id)
            return list(logp.float().split(torch.bincount(row, minlength=len(idx)).tolist()))

        by_key = {}
        with torch.no_grad(), self.policy.reference() as ref:
            was_training = ref.training
            ref.eval()
            try:
                scored = pool.map(partial(score, ref), chunks) if pool else map(partial(score, ref), chunks)
                for idx, logps in zip(chunks, scored):
                    by_key.update((keys[i], lp) for i, lp in zip(idx, logps))
            finally:
                ref.train(was_training)
        return [by_key[key] for key in keys]

    def micro_batch(self, samples: Sequence, idx: list[int], refs, adv_t: torch.Tensor, tok_w: list[torch.Tensor],
                    denom: float, with_grads: bool) -> MicroBatch:
        """The loss of the steps ``idx`` (normalised by the minibatch's ``denom``); with ``with_grads``
        also its gradients (``torch.autograd.grad``: nothing is accumulated into ``.grad``)."""
        device = self.accelerator.device
        chunk = [samples[j] for j in idx]
        with self.accelerator.autocast():
            new_logp, entropy, row = sample_logprobs(self.model, chunk, self.policy.pad_id)
        new_logp, entropy = new_logp.float(), entropy.float()
        ref = torch.cat([refs[j] for j in idx]).to(device) if refs is not None else None
        loss, stats = ppo_loss(new_logp, old_logprobs(chunk, device), adv_t[torch.as_tensor(idx, device=device)][row],
                               clip=self.clip, clip_c=self.clip_c, ref_logp=ref, kl_coef=self.kl_coef, entropy=entropy,
                               entropy_coef=self.entropy_coef, norm=denom,
                               weights=torch.cat([tok_w[j] for j in idx]).to(device))
        grads = None
        if with_grads and torch.isfinite(loss):
            grads = list(torch.autograd.grad(loss, self.params, allow_unused=True))
        return MicroBatch(loss, stats, new_logp.numel(), sum(s.num_tokens for s in chunk), grads)

    def minibatch_gradients(self, pool: ThreadPoolExecutor | None, run, chunks: list[list[int]], stoppable: bool,
                            sums: dict[str, float]) -> tuple[bool, bool, float, int, int]:
        """A minibatch's gradients in ``.grad``: its micro-batches ``chunks`` through ``run`` (on the pool's
        threads, the longest first, gradients summed in micro-batch order; else here, with
        ``accelerator.backward``), their stats added to ``sums``. Returns (ok: every loss finite, stop:
        ``stoppable`` and approx_kl over 1.5 x target_kl (SB3's early stop: this minibatch has moved too
        far from the rollout policy; decided before its last backward), its approx_kl, loss tokens and
        model tokens accumulated)."""
        futures = {k: pool.submit(run, chunks[k]) for k in reversed(range(len(chunks)))} if pool else {}
        grads, kl, n, counted, tokens, ok, stop = None, 0.0, 0, 0, 0, True, False
        try:
            for k, idx in enumerate(chunks):
                m = futures[k].result() if pool else run(idx)
                if fault_point("ppo.loss") or not torch.isfinite(m.loss):  # fault: test-only (envs/faults.py)
                    ok = False
                    break
                kl, n = kl + float(m.stats["approx_kl"]) * m.n, n + m.n
                if stoppable and k == len(chunks) - 1 and kl / n > 1.5 * self.target_kl:
                    stop = True
                    break
                if pool:
                    grads = add_grads(grads, m.grads)
                else:
                    self.accelerator.backward(m.loss)
                for key, value in m.stats.items():
                    sums[key] = sums.get(key, 0.0) + float(value) * m.n
                counted, tokens = counted + m.n, tokens + m.tokens
        finally:
            wait(futures.values())  # no thread may still read the weights when the optimizer steps
        for param, grad in zip(self.params, grads or []):
            param.grad = grad
        return ok, stop, kl / max(n, 1), counted, tokens

    def _advance_schedule(self) -> None:
        """One lr-schedule step per update, whether it stepped the optimizer or was skipped. A skipped
        first update is deliberate, so torch's warning "lr_scheduler.step() before optimizer.step()" is
        silenced here."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
            self.scheduler.step()
        self.updates += 1

    def update(self, samples: Sequence[ScoreSample | GenerateSample], advantages: np.ndarray,
               sample_weights: np.ndarray | None = None) -> dict[str, float]:
        """One PPO update on ``samples`` (one per step) with per-step ``advantages``; ``sample_weights``
        (default 1) weight each step in the loss ("episode-mean": 1 / episode length)."""
        start = time.perf_counter()
        adv = np.asarray(advantages, dtype=np.float64).reshape(-1)
        if len(samples) != len(adv):
            raise PPOConfigError(f"ppo.update: {len(samples)} samples but {len(adv)} advantages")
        weights = np.ones(len(adv)) if sample_weights is None else np.asarray(sample_weights, dtype=np.float64)
        if weights.shape != adv.shape:
            raise PPOConfigError(f"ppo.update: {len(samples)} samples but {weights.size} sample weights")
        if not samples:
            raise PPOConfigError("ppo.update: no samples")
        if len({type(s) for s in samples}) != 1:
            raise PPOConfigError("ppo.update: samples mix score and generate modes")
        metrics = {"skipped": False, "skipped_steps": 0, "optimizer_steps": 0, "lr": self.scheduler.get_last_lr()[0],
                   "early_stopped": 0.0}
        if not np.all(np.isfinite(adv)):
            metrics.update(skipped=True, skipped_reason="non-finite advantages", time_s=time.perf_counter() - start)
            return metrics
        metrics.update(adv_mean=float(adv.mean()), adv_std=float(adv.std()), adv_zero_share=float(np.mean(adv == 0)))
        if self.kl_coef == 0 and not any_rank(bool(np.any(adv != 0)), self.accelerator):
            # No advantage signal on any rank (every rollout of every group failed alike): the loss
            # would be the entropy bonus alone, which Adam, blind to the gradient's scale, turns into
            # full-size steps toward the uniform policy. The lr schedule still advances.
            self._advance_schedule()
            metrics.update(no_signal=1.0, skipped_reason="no advantage signal (every advantage is 0)",
                           time_s=time.perf_counter() - start)
            return metrics
        adv = normalise_advantages(adv, self.advantage_norm)
        device = self.accelerator.device
        adv_t = torch.as_tensor(adv, dtype=torch.float32, device=device)
        tok_w = token_weights(samples, weights, self.loss_agg)
        sums: dict[str, float] = {}
        counted = 0
        grad_norms = []
        tokens = 0
        self.model.train()
        stop = False
        with micro_batch_pool(pool_workers(self.accelerator, self.model, self.threads)) as pool:
            refs = self.reference_logprobs(samples, pool) if self.kl_coef > 0 else None
            for _ in range(self.epochs):
                perm = torch.randperm(len(samples)).tolist()
                for mb in minibatches(perm, self.minibatch_size, self.accelerator):
                    denom = float(sum(float(tok_w[j].sum()) for j in mb))
                    self.optimizer.zero_grad(set_to_none=True)
                    if self.micro_batch_size < len(mb):  # micro-batches of similar lengths: little padding
                        mb = sorted(mb, key=lambda j: samples[j].num_tokens)
                    run = partial(self.micro_batch, samples, refs=refs, adv_t=adv_t, tok_w=tok_w, denom=denom,
                                  with_grads=pool is not None)
                    ok, stop, approx_kl, n, mb_tokens = self.minibatch_gradients(
                        pool, run, [mb[k:k + self.micro_batch_size] for k in range(0, len(mb), self.micro_batch_size)],
                        self.target_kl > 0 and metrics["optimizer_steps"] > 0, sums)
                    counted, tokens = counted + n, tokens + mb_tokens
                    ok, stop = sync_gradients(self.params, ok, stop, self.accelerator)  # data parallel: average over ranks
                    if stop:
                        self.optimizer.zero_grad(set_to_none=True)
                        metrics["early_stopped"] = 1.0
                        break
                    if ok:
                        grad_norm = self.accelerator.clip_grad_norm_(self.params, self.max_grad_norm)
                        ok = bool(torch.isfinite(grad_norm))
                    if not ok:
                        self.optimizer.zero_grad(set_to_none=True)
                        metrics["skipped_steps"] += 1
                        continue
                    grad_norms.append(float(grad_norm))
                    fault_point("ppo.step")  # test-only: a kill mid-update (envs/faults.py)
                    self.optimizer.step()
                    metrics["optimizer_steps"] += 1
                    metrics["approx_kl_last"] = approx_kl
                if stop:
                    break
        self.optimizer.zero_grad(set_to_none=True)
        self._advance_schedule()
        elapsed = time.perf_counter() - start
        if metrics["optimizer_steps"] == 0:
            metrics["skipped_reason"] = "non-finite loss or gradient"
        metrics.update({key: value / max(counted, 1) for key, value in sums.items()})
        metrics.update(skipped=metrics["skipped_steps"] > 0, grad_norm=float(np.mean(grad_norms)) if grad_norms else float("nan"),
                       grad_norm_max=float(np.max(grad_norms)) if grad_norms else float("nan"),
                       tokens=tokens, tokens_per_s=tokens / elapsed, time_s=elapsed)
        metrics.setdefault("kl", 0.0)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.updates = int(state["updates"])
