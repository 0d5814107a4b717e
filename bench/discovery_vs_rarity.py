"""Discovery as successes become rare (issue 41, item 2): every estimator's credit AUC, and MileGPO's
milestone precision / recall against the engine's true subgoals and trap precision against the
oracle, over bins of the group's success share, on the credit-diagnostics recordings.

    .venv/bin/python bench/discovery_vs_rarity.py                 # both recordings, 1,000 resamples
    .venv/bin/python bench/discovery_vs_rarity.py --env alfworld --resamples 200

A group's success share is the fraction of its rollouts that succeeded (groups of 8: 0/8 ... 8/8),
the rarity that group's estimator sees. Bins: none, one, 2-3, 4-7, all of the group. Intervals:
percentile bootstrap over the bin's groups (diagnostics.GroupBootstrap). Trap precision: the share
of steps that enter a credited trap whose action the oracle labels bad (a recall is not defined: most
bad steps enter no recurring state). Writes bench/results/discovery_vs_rarity.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from milegpo_cli.credit import RolloutBatch, compute_advantages  # noqa: E402
from milegpo_cli.experiments.credit_bench import Recording, default_variants, evaluate  # noqa: E402
from milegpo_cli.experiments.credit_recording import read_records  # noqa: E402
from milegpo_cli.experiments.diagnostics import GroupBootstrap  # noqa: E402

RESULTS = ROOT / "bench" / "results"
BINS = (("none", 0.0, 0.0), ("one", 1e-9, 0.125), ("2-3 of 8", 0.125 + 1e-9, 0.375),
        ("4-7 of 8", 0.375 + 1e-9, 1 - 1e-9), ("all", 1.0, 1.0))
ESTIMATORS = ("grpo", "gigpo", "graphgpo", "hgpo", "oracle-milestones", "milegpo", "milegpo-no-traps",
              "milegpo-no-milestones", "milegpo-v2", "milegpo-paper")


def group_success_share(rec: Recording) -> np.ndarray:
    """Per rollout: the success share of its group."""
    won: dict[str, list[bool]] = {}
    for r in rec.rollouts:
        won.setdefault(r.group, []).append(bool(r.success))
    return np.array([np.mean(won[r.group]) for r in rec.rollouts])


def trap_precision(rec: Recording, variant, n_resamples: int, seed: int) -> dict:
    """Share of trap-entering steps whose action the oracle labels bad, [95 % CI] over groups."""
    batch = RolloutBatch.from_rollouts(rec.rollouts)
    res = compute_advantages(batch, variant.algo, variant.config, variant.drop)
    known = np.array([g is not None for g in rec.oracle_good])
    good = np.array([bool(g) for g in rec.oracle_good])
    group = np.asarray(batch.step_group, dtype=int)
    boot = GroupBootstrap(group, good, known, batch.num_groups, n_resamples, seed)
    trap = res.trap.astype(bool) & known
    n = np.bincount(group[trap], minlength=batch.num_groups).astype(float)
    bad = np.bincount(group[trap & ~good], minlength=batch.num_groups).astype(float)
    est = boot.ratio(bad, n)
    return {"traps": int(n.sum()), "trap_precision": est.value, "trap_precision_lo": est.low,
            "trap_precision_hi": est.high}


def analyse(env: str, n_resamples: int, seed: int = 0) -> list[dict]:
    rec = Recording.from_records(read_records(RESULTS / f"rollouts_{env}.jsonl.gz"))
    variants = [v for v in default_variants(env) if v.name in ESTIMATORS]
    share = group_success_share(rec)
    rows = []
    for name, lo, hi in BINS:
        keep = (share >= lo) & (share <= hi)
        if not keep.any():
            continue
        sub = rec.subset(keep)
        succ = float(np.mean([bool(r.success) for r in sub.rollouts]))
        for row in evaluate(sub, variants, n_resamples=n_resamples, seed=seed):
            v = next(v for v in variants if v.name == row["method"])
            traps = trap_precision(sub, v, n_resamples, seed) if v.algo == "milegpo" else {}
            rows.append({"env": env, "bin": name, "rollout_success": succ, **row, **traps})
        print(f"{env} {name}: {rows[-1]['groups']} groups, success {succ:.3f}", flush=True)
    return rows


def _ci(r: dict, k: str) -> str:
    v = r.get(k)
    if v is None or not np.isfinite(v):
        return "-"
    return f"{v:.3f} [{r[k + '_lo']:.2f}, {r[k + '_hi']:.2f}]"


def render(rows: list[dict]) -> str:
    out = ["# Discovery vs rarity (bench/discovery_vs_rarity.py)", "",
           "Groups of the credit-diagnostics recordings binned by their success share (the rarity each group's",
           "estimator sees). Credit AUC: ROC-AUC of the advantages against the oracle labels; milestone",
           "precision / recall against the engine's true subgoals (MileGPO variants and the oracle-milestone",
           "reference); trap precision: share of trap entries the oracle labels bad. [95 % CI] by bootstrap",
           "over the bin's groups.", ""]
    for env in dict.fromkeys(r["env"] for r in rows):
        out += [f"## {env}", "", "| bin | groups | rollout success | estimator | AUC | ms precision | ms recall | "
                "trap precision (traps) |", "|---|---|---|---|---|---|---|---|"]
        for r in (r for r in rows if r["env"] == env):
            traps = "-" if "traps" not in r else f"{_ci(r, 'trap_precision')} ({r['traps']})"
            out.append(f"| {r['bin']} | {r['groups']} | {r['rollout_success']:.3f} | {r['method']} | {_ci(r, 'auc')} "
                       f"| {_ci(r, 'ms_precision')} | {_ci(r, 'ms_recall')} | {traps} |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", nargs="+", default=["alfworld", "webshop"])
    ap.add_argument("--resamples", type=int, default=1000)
    args = ap.parse_args()
    rows = [r for env in args.env for r in analyse(env, args.resamples)]
    (RESULTS / "discovery_vs_rarity.json").write_text(json.dumps(rows, indent=1, default=float))
    (RESULTS / "discovery_vs_rarity.md").write_text(render(rows))
    print(render(rows))


if __name__ == "__main__":
    main()
