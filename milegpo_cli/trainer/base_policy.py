"""The cached base policy: the CPU-scale analogue of the instruct model agent RL starts from.

Published agent RL (verl-agent, GiGPO) starts PPO from a model that can already act. Here the tiny
local model is trained once by supervised learning (trainer/warmstart.py: cross-entropy of the
expert's command under the candidate softmax) on ``base.walkthroughs`` expert walkthroughs of train
games from the base range (trainer/task_pools.py: disjoint from every PPO pool, every warm start and
the id / ood evaluation lists), then cached under ``<store.root>/models/base-<version>``. The version
is a hash of everything that shapes it (tiny architecture, tokenizer corpus, prompt settings,
environment settings, ``[base]``), so a recipe that changes any of them builds its own. Concurrent
runs wait on a file lock and build it once.
"""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

BASE_VERSION = 3  # 2: own seed (base.seed); 3: prompts keep the task line when the observation is cut
# per environment, how its base is built (a new version rebuilds that environment's base only).
# alfworld 2: the handcoded expert's tie-breaks no longer depend on the games beside it (workers; its gaps still do,
# trainer/rollout.expert_walkthroughs);
# 3: supervised training on one thread (the WebShop recipe's base was already built on one)
ENV_BASE_VERSION = {"alfworld": 3}
MARKER = "base.json"
# environment settings that change how steps are computed, not the games or the observations
ENV_RUNTIME_KEYS = ("workers", "step_timeout_s", "data_dir", "cache", "cache_size", "oracle_share", "workers_backend",
                    "ray_resource", "ray_worker_cpus")

# sizes of the evaluation pools: the base plays train games only and game i of a split does not depend
# on them, so they are hashed at their defaults (a recipe with a larger id / ood pool keeps its base)
_EVAL_POOL_KEYS = ("id_games", "ood_games")


def _env_fingerprint(config) -> dict:
    """The environment settings that shape games and observations (not how they are computed)."""
    env = getattr(config.env, config.env.name)
    defaults = {f.name: f.default for f in dataclasses.fields(env) if f.name in _EVAL_POOL_KEYS}
    sub = {**dataclasses.asdict(env), **defaults}
    return {"name": config.env.name, "max_steps": config.env.max_steps,
            config.env.name: {k: v for k, v in sub.items() if k not in ENV_RUNTIME_KEYS},
            **({"base_version": ENV_BASE_VERSION[config.env.name]} if config.env.name in ENV_BASE_VERSION else {})}


def base_fingerprint(base) -> dict:
    """``[base]`` as hashed: ``seed`` only when it is not 0, so the bases built before it existed
    (trained under seed 0) keep their versions."""
    return {k: v for k, v in dataclasses.asdict(base).items() if not (k == "seed" and v == 0)}


def base_version(config, tiny_folder: str | Path) -> str:
    """Hash of the base policy's recipe: architecture + tokenizer (the tiny folder's name is the
    hash of both), prompt and action settings, environment, [base]."""
    p = config.policy
    blob = {"v": BASE_VERSION, "tiny": Path(tiny_folder).name, "mode": p.action_mode, "history": p.history,
            "max_prompt_tokens": p.max_prompt_tokens, "score_norm": p.score_norm, "temperature": p.temperature,
            "env": _env_fingerprint(config), "base": base_fingerprint(config.base)}
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:12]


def base_policy_dir(config, tiny_folder: str | Path) -> Path:
    return Path(config.store.root) / "models" / f"base-{base_version(config, tiny_folder)}"


def build_base_policy(config, suite, policy, log=print) -> dict[str, float]:
    """Train ``policy`` (the untrained tiny model) on the base walkthroughs under ``base.seed`` (the
    caller's RNG is left as it was); returns its metrics."""
    import torch

    from milegpo_cli.trainer.rollout import expert_walkthroughs
    from milegpo_cli.trainer.task_pools import base_tasks
    from milegpo_cli.trainer.threads import torch_threads
    from milegpo_cli.trainer.warmstart import supervised_warm_start

    cfg = config.base
    start = time.perf_counter()
    tasks = base_tasks(suite, cfg.walkthroughs)
    venv = suite.make_vector_env(min(len(tasks), 16), oracle=True)
    try:
        steps, won = expert_walkthroughs(venv, tasks, suite.max_steps, log)
    finally:
        venv.close()
    log(f"base policy: {len(tasks)} expert walkthroughs ({won} won, {len(steps)} steps) in "
        f"{time.perf_counter() - start:.0f} s; supervised training, {cfg.epochs} epochs")
    # one torch thread whatever run.threads or OMP_NUM_THREADS say: the sums of a step depend on the
    # thread count, and after four epochs the weights do too (same recipe, same base policy)
    with torch.random.fork_rng(devices=[]), torch_threads(1):
        torch.manual_seed(cfg.seed)
        out = supervised_warm_start(policy, steps, cfg.epochs, cfg.lr, minibatch_size=cfg.minibatch_size, log=log)
    return {**{k.replace("warmstart_", "base_"): v for k, v in out.items()},
            "base_walkthroughs": float(len(tasks)), "base_expert_won": float(won),
            "base_build_s": time.perf_counter() - start}


def ensure_base_policy(config, suite, device, log=print) -> Path:
    """The base policy's folder (a policy checkpoint, trainer.Policy.save layout), built if missing."""
    from milegpo_cli.policy import Policy

    if config.policy.model != "tiny":
        from milegpo_cli.errors import ConfigError
        raise ConfigError("base.enabled: the cached base policy is built from the tiny model "
                          f"(policy.model = 'tiny'); got policy.model = {config.policy.model!r}")
    untrained = Policy.from_config(dataclasses.replace(config.policy, lora=False), suite.text_corpus(),
                                   cache_dir=Path(config.store.root) / "models", device=device)
    folder = base_policy_dir(config, untrained.base)
    if (folder / MARKER).exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder; the others wait and then find it built
        if (folder / MARKER).exists():
            return folder
        log(f"building the base policy {folder.name} (once; cached in {folder.parent})")
        metrics = build_base_policy(config, suite, untrained, log)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        try:
            untrained.save(tmp)
            (tmp / MARKER).write_text(json.dumps({"version": folder.name, "metrics": metrics,
                                                  "config": dataclasses.asdict(config.base)}, indent=1))
            shutil.rmtree(folder, ignore_errors=True)  # an interrupted earlier build
            os.rename(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def base_metrics(folder: str | Path) -> dict[str, float]:
    """The metrics recorded when the base policy was built."""
    return json.loads((Path(folder) / MARKER).read_text())["metrics"]


def build_for_recipe(config, log=print) -> tuple[Path, dict[str, float]]:
    """`milegpo policy build-base`: the recipe's base policy folder (built if missing) and its metrics."""
    from envs.registry import make_suite
    from milegpo_cli.policy.hf import resolve_device
    from milegpo_cli.trainer.threads import plan_threads

    plan_threads(config).apply()
    env = config.env
    suite = make_suite(env.name, alfworld=env.alfworld, webshop=env.webshop, max_steps=env.max_steps)
    try:
        folder = ensure_base_policy(config, suite, resolve_device(config.run.device), log)
    finally:
        suite.close()
    return folder, base_metrics(folder)
