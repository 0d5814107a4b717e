"""Where does the expert-action probe move? Per probe state, the change of log pi(expert action |
state) from the policy PPO started from (the cached base policy) to a run's checkpoint, grouped by
the expert command's verb ("go", "take", "move", ...). The probe of a run is one mean over held-out
expert states; this splits it, e.g. to tell search navigation ("go to", where ALFWorld's handcoded
expert follows its own receptacle order) from the steps that do the task (take, move, clean, ...).

    python bench/probe_verbs.py --runs-dir runs/learning-alfworld-base3 --run 1 --label alfworld-base3-s0

Reads the run's stored config, collects the same probe states as training does (trainer/evaluation.py
``Probe``), loads the base policy of that config and the run's newest (or ``--iteration``) checkpoint,
and writes bench/results/probe_verbs_<label>.json and .md.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from milegpo_cli.config import Config  # noqa: E402
from milegpo_cli.policy import Policy  # noqa: E402
from milegpo_cli.store import RunStore  # noqa: E402
from milegpo_cli.trainer import builders, resume  # noqa: E402
from milegpo_cli.trainer.base_policy import ensure_base_policy  # noqa: E402
from milegpo_cli.trainer.checkpoint import find_checkpoint  # noqa: E402
from milegpo_cli.trainer.evaluation import EVAL_ENVS, Probe  # noqa: E402


def by_verb(actions: list[str], start: tuple[list[float], list[bool]], final: tuple[list[float], list[bool]]) -> dict:
    """verb -> states, mean log-probability and accuracy at the start and at the checkpoint."""
    a, b = np.asarray(start[0]), np.asarray(final[0])
    ha, hb = np.asarray(start[1]), np.asarray(final[1])
    groups = collections.defaultdict(list)
    for i, action in enumerate(actions):
        groups[action.split()[0]].append(i)
    out = {"all": list(range(len(actions))), **dict(sorted(groups.items(), key=lambda kv: -len(kv[1])))}
    return {verb: {"states": len(idx), "logp_start": float(a[idx].mean()), "logp_final": float(b[idx].mean()),
                   "logp_gain": float((b[idx] - a[idx]).mean()), "acc_start": float(ha[idx].mean()),
                   "acc_final": float(hb[idx].mean()),
                   "share_of_gain": float((b[idx] - a[idx]).sum() / len(actions))}
            for verb, idx in ((v, np.asarray(i)) for v, i in out.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs-dir", type=Path, required=True)
    parser.add_argument("--run", type=int, required=True)
    parser.add_argument("--iteration", type=int, default=None, help="checkpoint iteration (default: the newest)")
    parser.add_argument("--split", default="id")
    parser.add_argument("--label", required=True)
    args = parser.parse_args()
    os.environ.setdefault("ALFWORLD_DATA", str(ROOT / "runs" / "alfworld_data"))

    store = RunStore(f"sqlite:///{args.runs_dir / 'milegpo.db'}")
    config = Config.from_dict(store.get_run(args.run)["config"])
    if not config.base.enabled or config.warmstart.enabled:
        raise SystemExit(f"run {args.run} did not start from the base policy alone; its start cannot be re-scored here")
    suite = builders.build_suite(config)
    try:
        probe = Probe.collect(suite, [args.split], config.eval.episodes, config.eval.probe_states, EVAL_ENVS)
        base = ensure_base_policy(config, suite, "cpu")
    finally:
        suite.close()
    ckpt = find_checkpoint(resume.checkpoint_root(config, args.run), args.iteration)
    start = probe.state_scores(Policy.start_from(base, config.policy, "cpu"), args.split)
    final = probe.state_scores(Policy.load(ckpt.policy_dir, config.policy, "cpu"), args.split)
    table = by_verb([s.action for s in probe.steps[args.split]], start, final)

    out = ROOT / "bench" / "results" / f"probe_verbs_{args.label}"
    out.with_suffix(".json").write_text(json.dumps(
        {"runs_dir": str(args.runs_dir), "run": args.run, "iteration": ckpt.iteration, "split": args.split,
         "algo": config.run.algo, "seed": config.run.seed, "base": str(base), "verbs": table}, indent=1))
    lines = [f"Probe by expert verb: run {args.run} of `{args.runs_dir}` ({config.run.algo}, seed {config.run.seed}), "
             f"{args.split} probe, base policy -> iteration {ckpt.iteration}.", "",
             "| verb | states | logp start -> final | gain | share of the mean gain | acc start -> final |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {v} | {r['states']} | {r['logp_start']:.3f} -> {r['logp_final']:.3f} | {r['logp_gain']:+.3f} | "
              f"{r['share_of_gain']:+.3f} | {r['acc_start']:.2f} -> {r['acc_final']:.2f} |" for v, r in table.items()]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
