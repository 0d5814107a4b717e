"""The start evaluation a run shares with a finished run that started exactly like it.

The members of a comparison or an ablation with the same seed start from the same cached base policy and
are evaluated on the same fixed lists with the same draws (``derive_seed(seed, "eval", 0, split)``) before
their first update: the algorithm, its credit settings and the PPO schedule play no part until then. A run
whose every input to that evaluation is a finished run's copies that run's iteration-0 evaluations (metrics,
episodes, steps) instead of playing them again: on the comparison recipe, one of a run's three evaluations
of 2 x 306 episodes (docs/testbed.md, "Shared start evaluations").

Shared only when all of these hold, else the run evaluates its start itself:
- it starts from the cached base policy as it is (``base.enabled``, no per-run warm start, no evaluation of
  the untrained model), in one process;
- the finished run is in the same store, has the same seed, source digest (trainer/provenance.py: the
  code, whatever its git commit) and package versions, recorded the same testbed digests
  (trainer/testbed.py: games by content, base policy by its weights) and has the same config outside
  ``TRAINING_ONLY``.
"""
from __future__ import annotations

from milegpo_cli.config import Config
from milegpo_cli.trainer.testbed import KEYS as TESTBED_KEYS

# config keys with no part in a run before its first update: the algorithm and its credit, the PPO update and
# schedule, how often it evaluates and checkpoints later, its name and where it is stored
TRAINING_ONLY = (("run", "algo"), ("run", "name"), ("run", "iterations"), ("credit",), ("ppo",), ("eval", "every"),
                 ("checkpoint",), ("store",), ("recipe",))


def start_inputs(config: dict) -> dict:
    """A config (as ``Config.to_dict`` gives it) without its ``TRAINING_ONLY`` keys."""
    out = {section: dict(v) if isinstance(v, dict) else v for section, v in config.items()}
    for path in TRAINING_ONLY:
        parent = out if len(path) == 1 else out.get(path[0], {})
        parent.pop(path[-1], None)
    return out


def can_share_start(config: Config, processes: int) -> bool:
    """Whether the run starts from the cached base policy as it is, in one process."""
    return config.base.enabled and not config.warmstart.enabled and not config.eval.untrained and processes == 1


def shared_start(store, run_id: int, config: Config, testbed: dict[str, str]) -> int | None:
    """The finished run of ``store`` whose start evaluation ``run_id`` (config ``config``, testbed digests
    ``testbed``) would repeat, None when there is none. The caller checks ``can_share_start`` first."""
    packages = {k: v for k, v in (store.get_run(run_id)["versions"] or {}).items() if k not in TESTBED_KEYS}
    if not packages.get("milegpo_source") or not testbed.get("testbed_base"):
        return None
    inputs = start_inputs(config.to_dict())
    for other in store.list_runs():
        versions = other["versions"] or {}
        if (other["id"] == run_id or other["status"] != "finished" or other["seed"] != config.run.seed
                or any(versions.get(k) != testbed.get(k) for k in TESTBED_KEYS)
                or {k: v for k, v in versions.items() if k not in TESTBED_KEYS} != packages):
            continue
        theirs = Config.from_dict(other["config"])
        if can_share_start(theirs, 1) and start_inputs(theirs.to_dict()) == inputs:
            return other["id"]
    return None
