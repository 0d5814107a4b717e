"""What a run is built from, given its config: the task suite, the accelerator and the policy."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from milegpo_cli.config import Config


def build_suite(config: Config, workers: int | None = None):
    """The config's environment suite; ``workers``: its ALFWorld engine worker processes as the thread
    plan sized them (trainer/threads.py), None: as the config says."""
    from envs.registry import make_suite

    env = config.env
    alfworld = env.alfworld if workers is None else dataclasses.replace(env.alfworld, workers=workers)
    return make_suite(env.name, alfworld=alfworld, webshop=env.webshop, max_steps=env.max_steps)


def make_accelerator(config: Config):
    from accelerate import Accelerator

    return Accelerator(mixed_precision=config.run.mixed_precision, cpu=config.run.device == "cpu")


def build_policy(config: Config, suite, device, policy_dir: Path | None = None):
    from transformers.utils import logging as hf_logging

    from milegpo_cli.policy import Policy

    hf_logging.disable_progress_bar()

    if policy_dir is not None:
        return Policy.load(policy_dir, config.policy, device=device)
    return Policy.from_config(config.policy, suite.text_corpus(), cache_dir=Path(config.store.root) / "models",
                              device=device)
