"""Does the restarted comparison grid reproduce the lost store's runs? (docs/testbed.md, "Restarted on a
fresh machine"). For every finished run of the main comparison (no ablation) in a store, its start and
final id / ood success against the per-seed figures of `bench/results/learning_grid50-<algo>.json`,
which the lost store's runs gave (seeds 0-7, and 8 for some methods).

    python bench/grid_reproduces.py [STORE]   # default runs/grid-compare/milegpo.db; exit 1 on a mismatch
"""
from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main(store: str) -> int:
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    mismatches = 0
    runs = db.execute("select id, algo, seed from runs where status = 'finished' and \"drop\" = '[]' order by seed, id")
    for run, algo, seed in runs.fetchall():
        evals = {(it, split): rate for it, split, rate in db.execute(
            "select iteration, split, success_rate from evaluations where run_id = ? and checkpoint is null", (run,))}
        last = max(it for it, _ in evals)
        mine = [evals[(0, "id")], evals[(last, "id")], evals[(0, "ood")], evals[(last, "ood")]]
        published = RESULTS / f"learning_grid50-{algo}.json"
        lost = json.loads(published.read_text())["per_seed"].get(str(seed)) if published.exists() else None
        shown = " ".join(f"{100 * x:.1f}" for x in mine)
        if lost is None:
            print(f"run {run} {algo} s{seed}: {shown} (no published figure)")
            continue
        theirs = [lost["id"]["start_success"], lost["id"]["final_success"], lost["ood"]["start_success"],
                  lost["ood"]["final_success"]]
        same = all(abs(a - b) < 1e-12 for a, b in zip(mine, theirs))
        mismatches += not same
        print(f"run {run} {algo} s{seed}: id start/final, ood start/final {shown} %: "
              + ("equal" if same else "DIFFERENT from " + " ".join(f"{100 * x:.1f}" for x in theirs)))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "runs/grid-compare/milegpo.db"))
