"""Data parallel over processes (issue 18, docs/scale.md).

Under ``accelerate launch --num_processes K`` each rank plays its own G groups of an iteration: the
K x G tasks are drawn once from (seed, iteration), identically on every rank, and rank r plays the
r-th block of G (:func:`shard`); its rollouts' random draws derive from (seed, iteration, rank)
(:func:`rank_parts`); its groups are numbered r x G .. r x G + G - 1 so that group keys stay unique
in the run. Groups are independent, so credit is computed per rank. After the backward passes of
each minibatch the gradients (and every rank's verdict on that minibatch: usable / stop early) are
summed over ranks in one all-reduce and divided by K (:func:`sync_gradients`), so every rank applies
the same optimizer step and the weights stay identical (:func:`weights_checksum`, checked every
iteration). Ranks agree on the number of minibatches (:func:`minibatches`). Rank 0 gathers the
episode records, candidates and episode summaries of all ranks (:func:`gather_iteration`) and alone
writes the store, MLflow and checkpoints.

The model is not wrapped in DistributedDataParallel: its per-backward all-reduce would deadlock as
soon as ranks run different numbers of micro-batches or one rank skips a non-finite minibatch. Under
FSDP or DeepSpeed (``accelerate config``) accelerate wraps and synchronises the model itself and
:func:`sync_gradients` leaves it alone (see docs/scale.md for what that path does not guarantee).
With one process every function here is the identity: single-process runs are unchanged.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any, Sequence

import numpy as np
import torch


def world_size(accelerator) -> int:
    return int(accelerator.num_processes)


def _own_sync(accelerator) -> bool:
    """True when the gradients are ours to all-reduce: plain multi-process data parallel
    (accelerate's MULTI_CPU, MULTI_GPU, ... types), not FSDP / DeepSpeed / XLA / Megatron."""
    return accelerator.num_processes > 1 and accelerator.distributed_type.name.startswith("MULTI_")


def rank_parts(accelerator) -> tuple:
    """Extra labels of a rank's seeds: none for rank 0 (so one process seeds as before)."""
    rank = int(accelerator.process_index)
    return () if rank == 0 else ("rank", rank)


def shard(items: Sequence, accelerator) -> list:
    """This rank's block of ``items`` (K equal blocks, in rank order)."""
    k, rank = world_size(accelerator), int(accelerator.process_index)
    size = len(items) // k
    return list(items[rank * size:(rank + 1) * size])


def group_offset(accelerator, groups: int) -> int:
    """Number of this rank's first group: rank x G."""
    return int(accelerator.process_index) * groups


def prepare(accelerator, model, optimizer):
    """``accelerator.prepare`` without the DDP wrapper when :func:`sync_gradients` owns the sync."""
    if not _own_sync(accelerator):
        return accelerator.prepare(model, optimizer)
    return model.to(accelerator.device), accelerator.prepare_optimizer(optimizer)


def minibatches(perm: Sequence[int], size: int, accelerator) -> list[list[int]]:
    """Minibatches of ``perm`` (steps of this rank). One process: consecutive blocks of ``size``.
    K processes: every rank makes the same number M = ceil(max_r n_r / size) (at most min_r n_r, so
    none is empty) of near-equal minibatches, so the ranks' optimizer steps pair up."""
    perm = list(perm)
    if world_size(accelerator) == 1:
        return [perm[i:i + size] for i in range(0, len(perm), size)]
    from accelerate.utils import gather_object

    counts = gather_object([len(perm)])
    m = max(1, min(math.ceil(max(counts) / size), min(counts)))
    return [list(map(int, block)) for block in np.array_split(np.asarray(perm, dtype=np.int64), m)]


def sync_gradients(params: Sequence[torch.Tensor], ok: bool, stop: bool, accelerator) -> tuple[bool, bool]:
    """Average the gradients over ranks (a missing gradient counts as zero) and agree on the
    minibatch: usable only if usable on every rank, stopped if stopped on any."""
    if not _own_sync(accelerator):
        return ok, stop
    import torch.distributed as dist

    device = params[0].device
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.detach().reshape(-1).float() for g in grads]
                     + [torch.tensor([0.0 if ok else 1.0, 1.0 if stop else 0.0], device=device)])
    dist.all_reduce(flat)
    flags = flat[-2:].tolist()
    flat = flat[:-2] / world_size(accelerator)
    offset = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = flat[offset:offset + n].view_as(g).to(g.dtype)
        offset += n
    return flags[0] == 0.0, flags[1] > 0.0


def any_rank(flag: bool, accelerator) -> bool:
    """``flag`` or'ed over ranks (one gather; one process: ``flag``), so that all ranks take the
    same branch before a collective such as :func:`sync_gradients`."""
    if accelerator.num_processes == 1:
        return flag
    return bool(accelerator.gather(torch.tensor([float(flag)], device=accelerator.device)).sum().item() > 0)


def weights_checksum(model) -> str:
    """SHA-256 of the trainable parameters (name order), exact bytes."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if p.requires_grad:
            h.update(name.encode())
            h.update(p.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def broadcast_object(obj: Any, accelerator) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if world_size(accelerator) == 1:
        return obj
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list([obj], from_process=0)[0]


@dataclasses.dataclass
class Gathered:
    episodes: list  # every rank's episodes without their training samples (for the metrics)
    records: list
    candidates: list
    steps: int
    world_size: int
    weights_equal: bool


def gather_iteration(episodes: Sequence, records: Sequence, candidates: Sequence, steps: int, model,
                     accelerator) -> Gathered:
    """Every rank's iteration output on every rank, in rank order, and whether the weights after
    the update are the same on all ranks."""
    if world_size(accelerator) == 1:
        return Gathered(list(episodes), list(records), list(candidates), steps, 1, True)
    from accelerate.utils import gather_object

    light = [dataclasses.replace(e, samples=[]) for e in episodes]
    sums = gather_object([weights_checksum(model)])
    return Gathered(gather_object(light), gather_object(list(records)), gather_object(list(candidates)),
                    sum(gather_object([steps])), world_size(accelerator), len(set(sums)) == 1)
