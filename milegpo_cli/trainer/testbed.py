"""A run's testbed: the tasks it is evaluated on and the base policy it starts from, as digests.

Code and packages are recorded with every run (trainer/provenance.py), but the games and the base policy
are generated into the run folder, and another machine or folder may generate different ones from the
same code and recipe (docs/testbed.md, "Restarted on a fresh machine"). A run computes the digests
(``testbed_games``, ``testbed_base``) when it starts and records them with its versions when it finishes
(in the same write as its status: no extra write), and a run of an experiment refuses to start on a
testbed other than the one its experiment's finished runs trained on: their figures would not compare.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from milegpo_cli.config import Config
from milegpo_cli.errors import MilegpoError
from milegpo_cli.trainer.base_policy import ENV_RUNTIME_KEYS
from milegpo_cli.trainer.evaluation import eval_tasks

KEYS = ("testbed_games", "testbed_base")


class MismatchedTestbed(MilegpoError):
    """A run of an experiment would train on other games or another base policy than its finished runs."""


def _task_bytes(task) -> bytes:
    """A task as it is played: a game by its file's content (not its path), any other task by its payload."""
    payload = dict(task.payload)
    game = payload.pop("gamefile", None)
    text = json.dumps([task.task_id, payload], sort_keys=True).encode()
    return text + (Path(game).read_bytes() if game else b"")


def _label(config: Config) -> str:
    """What the evaluation lists are made from (environment settings that shape games, splits, sizes, task
    types): runs whose labels differ have different lists by design (a sweep over one of them)."""
    env = getattr(config.env, config.env.name)
    shape = {k: v for k, v in dataclasses.asdict(env).items() if k not in ENV_RUNTIME_KEYS}
    blob = [config.env.name, config.env.max_steps, shape, list(config.eval.splits), config.eval.episodes,
            list(config.run.task_types)]
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:12]


def testbed_digest(config: Config, suite, base_folder: Path | None) -> dict[str, str]:
    """``testbed_games``: "<label>/<sha256 of every evaluation list's tasks>" (the same lists for every run of
    a recipe, whatever its seed); ``testbed_base``: "<base folder>/<sha256 of its weight files>" (only when
    PPO starts from a base policy). 16 hex digits each."""
    games = hashlib.sha256()
    for split in config.eval.splits:
        for task in eval_tasks(suite, split, config.eval.episodes, config.run.task_types):
            games.update(_task_bytes(task))
    out = {"testbed_games": f"{_label(config)}/{games.hexdigest()[:16]}"}
    if base_folder is not None:
        weights = hashlib.sha256()
        for f in sorted((base_folder / "model").glob("*.safetensors")):
            weights.update(f.read_bytes())
        out["testbed_base"] = f"{base_folder.name}/{weights.hexdigest()[:16]}"
    return out


def _differ(mine: str, theirs: str) -> bool:
    """Same name (label or base folder), other content."""
    return mine.split("/")[0] == theirs.split("/")[0] and mine != theirs


def check_testbed(store, run_id: int, digest: dict[str, str]) -> None:
    """Raise MismatchedTestbed when a finished run of ``run_id``'s experiment recorded, for the same lists or
    base policy, other content."""
    experiment = store.get_run(run_id)["experiment_id"]
    if experiment is None:
        return
    for other in store.list_runs(experiment):
        theirs = other["versions"] or {}
        differ = [k for k in KEYS if k in theirs and k in digest and _differ(digest[k], theirs[k])]
        if other["id"] != run_id and other["status"] == "finished" and differ:
            what = ", ".join(f"{k} {digest[k]} here, {theirs[k]} there" for k in differ)
            raise MismatchedTestbed(
                f"run {run_id}: experiment {experiment}'s run {other['id']} trained on another testbed ({what}): the "
                f"games or base policy in this run folder are not the ones its runs used; restore them "
                f"(docs/testbed.md, 'Restarted on a fresh machine') or start another experiment")
