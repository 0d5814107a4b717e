"""Credit conventions chosen by evidence (issue 33): ROC-AUC against the oracle labels, paired over groups.

1. ``anchor_visits`` on / off for every estimator with anchor groups (GiGPO, GraphGPO, HGPO, MileGPO v3), on
   the project's recordings (bench/results/rollouts_<env>.jsonl.gz), each at the recipe's [credit] settings.
2. ``graph_final`` = "fail" / "observed" for GraphGPO and MileGPO, on recordings that carry each rollout's
   ``final_state`` (``--final`` ENV=PATH; record them with bench/credit_diagnostics.py record).

Writes bench/results/baseline_conventions.json; dAUC = AUC(variant) - AUC(its reference), 95 % interval
from a bootstrap over groups (experiments/credit_bench.py).

    .venv/bin/python bench/baseline_conventions.py [--final webshop=/tmp/rollouts_webshop.jsonl.gz ...]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
ANCHORED = ("gigpo", "graphgpo", "hgpo", "milegpo")
KEYS = ("method", "groups", "steps", "auc", "auc_lo", "auc_hi", "d_auc", "d_auc_lo", "d_auc_hi", "reference")


def table(rec, variants, resamples: int) -> dict:
    from milegpo_cli.experiments import credit_bench as cb
    out = {}
    for name, sub in cb.subsets(rec):
        out[name] = [{k: row[k] for k in KEYS}
                     for row in cb.evaluate(sub, variants, n_resamples=resamples, with_milestones=False)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--envs", nargs="+", default=["webshop", "alfworld"])
    ap.add_argument("--final", nargs="*", default=[], metavar="ENV=PATH", help="recordings with final_state")
    ap.add_argument("--resamples", type=int, default=500)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    from credit_diagnostics import recipe_credit, rollouts_path
    from milegpo_cli.experiments import credit_bench as cb, credit_recording

    results = {"command": " ".join(["python bench/baseline_conventions.py", *sys.argv[1:]]),
               "generated": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "anchor_visits": {}, "graph_final": {}}
    for env in args.envs:
        base = recipe_credit(env)
        variants = []
        for algo in ANCHORED:
            on = cb.Variant(f"{algo} anchor_visits=on", algo, config=replace(base, anchor_visits=True))
            variants += [on, cb.Variant(f"{algo} anchor_visits=off", algo, config=replace(base, anchor_visits=False),
                                        reference=on.name)]
        rec = cb.Recording.from_records(credit_recording.read_records(rollouts_path(env)))
        results["anchor_visits"][env] = table(rec, variants, args.resamples)
        print(f"{env}: anchor_visits done", flush=True)
    for item in args.final:
        env, _, path = item.partition("=")
        base = recipe_credit(env)
        variants = []
        for algo in ("graphgpo", "milegpo"):
            fail = cb.Variant(f"{algo} graph_final=fail", algo, config=replace(base, graph_final="fail"))
            variants += [fail, cb.Variant(f"{algo} graph_final=observed", algo,
                                          config=replace(base, graph_final="observed"), reference=fail.name)]
        preset = cb.Variant("graphgpo preset=verl-agent", "graphgpo",
                            config=replace(base, preset="verl-agent", graph_gamma={"alfworld": 0.1}.get(env, 0.2)),
                            reference="graphgpo graph_final=fail")
        rec = cb.Recording.from_records(credit_recording.read_records(path))
        results["graph_final"][env] = {"recording": path, **table(rec, variants + [preset], args.resamples)}
        print(f"{env}: graph_final done", flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "baseline_conventions.json").write_text(json.dumps(results, indent=1, default=float) + "\n")
    for part in ("anchor_visits", "graph_final"):
        for env, subsets in results[part].items():
            for row in subsets.get("all", []):
                print(f"{part:13s} {env:8s} {row['method']:34s} AUC {row['auc']:.3f}  dAUC "
                      f"{row['d_auc']:+.3f} [{row['d_auc_lo']:+.3f}, {row['d_auc_hi']:+.3f}]")


if __name__ == "__main__":
    main()
