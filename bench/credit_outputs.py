"""Every estimator's outputs on the recordings in bench/results/, to check that a refactoring changed
none of them (issue 44).

``write`` computes, per recording, estimator and setting below, the advantage, its episode and step
parts and the credit of every step, and saves them to one ``.npz``; ``compare`` lists the entries of
two such files that differ (rows, largest difference) and exits 1 when any does. Run ``write`` on two
checkouts (e.g. ``git archive <commit> | tar -x -C /tmp/before``) with the same ``--out`` naming:

    PYTHONPATH=/tmp/before python bench/credit_outputs.py write /tmp/before.npz
    PYTHONPATH=$PWD        python bench/credit_outputs.py write /tmp/after.npz
    python bench/credit_outputs.py compare /tmp/before.npz /tmp/after.npz
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

RECORDINGS = sorted((Path(__file__).resolve().parent / "results").glob("rollouts_*.jsonl.gz"))
ESTIMATORS = ("grpo", "gigpo", "graphgpo", "milegpo", "hgpo", "oracle-milestones")
# setting name -> CreditConfig keyword arguments (only ones every checkout since d0c05d4 accepts)
SETTINGS = {
    "default": {},
    "verl-agent": {"preset": "verl-agent"},
    "verl-agent-mean": {"preset": "verl-agent", "episode_norm": "mean"},
    "v2": {"formulation": "v2"},
    "paper": {"formulation": "paper"},
    "step-mean": {"step_norm": "mean", "episode_stats": "steps"},
    "hgpo-base": {"hgpo_base_group": True, "anchor_visits": False},
    "no-zero-identical": {"zero_identical": False},
}
FIELDS = ("advantage", "episode_advantage", "step_advantage", "credit")


def write(out: Path) -> None:
    from milegpo_cli.credit import CreditConfig, RolloutBatch, compute_advantages
    from milegpo_cli.interchange import read_rollouts

    arrays = {}
    for path in RECORDINGS:
        batch = RolloutBatch.from_rollouts(read_rollouts(path), 1.0)
        for algo in ESTIMATORS:
            for setting, kwargs in SETTINGS.items():
                result = compute_advantages(batch, algo, CreditConfig(**kwargs))
                for field in FIELDS:
                    arrays[f"{path.name}|{algo}|{setting}|{field}"] = np.asarray(getattr(result, field))
        print(f"{path.name}: {batch.num_steps} steps", file=sys.stderr)
    np.savez_compressed(out, **arrays)


def compare(before: Path, after: Path) -> int:
    a, b = np.load(before), np.load(after)
    differ = 0
    for key in sorted(set(a.files) | set(b.files)):
        if key not in a.files or key not in b.files:
            print(f"{key}: only in {'after' if key in b.files else 'before'}")
            differ += 1
            continue
        x, y = a[key], b[key]
        rows = np.flatnonzero(x != y) if x.shape == y.shape else np.arange(max(x.size, y.size))
        if rows.size:
            differ += 1
            gap = float(np.max(np.abs(x[rows] - y[rows]))) if x.shape == y.shape else float("inf")
            print(f"{key}: {rows.size} of {x.size} rows differ, largest by {gap:.6g}")
    print(f"{len(a.files)} entries compared, {differ} differ")
    return 1 if differ else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("write").add_argument("out", type=Path)
    cmp = sub.add_parser("compare")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "write":
        write(args.out)
    else:
        sys.exit(compare(args.before, args.after))


if __name__ == "__main__":
    main()
