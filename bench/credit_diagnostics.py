"""Credit diagnostics at scale (issues 9 and 10): record rollouts of fixed behaviour policies, then
score every estimator's advantages against the oracle on the same rollouts.

Behaviour policy: the oracle's action with probability 1 - p, else a uniform admissible action;
groups of 8 rollouts of one task, one group per (task, p). Recordings (one JSON line per rollout,
docs/rollouts.md format + oracle labels and subgoals per step) go to
bench/results/rollouts_<env>.jsonl.gz and resume where they stopped.

    export ALFWORLD_DATA=$PWD/runs/alfworld_data
    .venv/bin/python bench/credit_diagnostics.py record --env webshop --tasks 300
    .venv/bin/python bench/credit_diagnostics.py record --env alfworld --tasks 30 --budget-min 18 --workers 2
    .venv/bin/python bench/credit_diagnostics.py analyse          # tables + docs/results_credit.md

``analyse`` writes bench/results/credit_diagnostics.{csv,json}, bench/results/credit_sweep.csv and
docs/results_credit.md (every figure there comes from these files).
"""
from __future__ import annotations

import argparse
import csv
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SWEEP_GRID = {"lambda_m": (0.0, 0.25, 1.0, 2.0), "lambda_t": (0.0, 0.5, 2.0, 4.0),
              "lambda_p": (0.0, 0.5, 1.0, 4.0), "prior_strength": (0.5, 1.0, 4.0, 8.0),
              "g_p": (0.0, 0.25, 1.0), "g_b": (0.0, 0.25, 1.0), "m_min": (1, 3, 4),
              "omega": (0.25, 0.5, 2.0, 4.0), "paper_eta": (0.0, 0.2, 0.5, 1.0)}
CANDIDATE = {"lambda_p": 4.0}  # the sweep's proposal, measured in the main table (not shipped: see docs)


def rollouts_path(env: str) -> Path:
    return RESULTS / f"rollouts_{env}.jsonl.gz"


def make_suite(env: str, workers: int, max_steps: int | None):
    from envs.registry import make_suite as _make
    if env == "alfworld":
        from envs.alfworld.config import AlfworldConfig
        return _make("alfworld", alfworld=AlfworldConfig(workers=workers), max_steps=max_steps)
    return _make(env, max_steps=max_steps)


def cmd_record(args) -> None:
    from milegpo_cli.experiments.credit_recording import record
    suite = make_suite(args.env, args.workers, args.max_steps)
    t0 = time.perf_counter()
    tasks = suite.tasks(args.split, args.tasks, seed=args.seed)
    print(f"{len(tasks)} {args.env} tasks ({args.split}) in {time.perf_counter() - t0:.1f} s", flush=True)
    out = record(suite, tasks, args.p, rollouts_path(args.env), group_size=args.group_size, seed=args.seed,
                 budget_s=None if args.budget_min is None else 60 * args.budget_min,
                 log=lambda s: print(s, flush=True))
    meta_path = RESULTS / f"rollouts_{args.env}.meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {"sessions": []}
    meta.update(env=args.env, split=args.split, max_steps=suite.max_steps, group_size=args.group_size,
                p=list(args.p), seed=args.seed, workers=args.workers if args.env == "alfworld" else None)
    meta["sessions"].append(out)
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(out), flush=True)
    suite.close()


def recipe_credit(env: str):
    """The [credit] section of recipes/<env>.toml: the settings training uses (issue 15)."""
    from milegpo_cli.config import read_recipe
    from milegpo_cli.credit import CreditConfig
    return CreditConfig.from_dict(read_recipe(env).get("credit", {}))


def cmd_analyse(args) -> None:
    from milegpo_cli.experiments import credit_bench as cb, credit_bench_report, credit_recording
    results = {"command": " ".join(["python bench/credit_diagnostics.py analyse", *sys.argv[2:]]),
               "generated": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "python": platform.python_version(),
               "resamples": args.resamples, "sweep_resamples": args.sweep_resamples, "envs": {}}
    csv_rows = []
    for env in args.envs:
        records = credit_recording.read_records(rollouts_path(env))
        if not records:
            raise SystemExit(f"no recording for {env}: run `record --env {env}` first")
        rec = cb.Recording.from_records(records)
        meta_path = RESULTS / f"rollouts_{env}.meta.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        settings = {k: meta.get(k) for k in ("split", "max_steps", "group_size", "p", "seed")}
        settings["engine_errors"] = rec.errors
        settings["recording_sessions"] = [{k: x[k] for k in ("new_groups", "new_steps", "wall_s", "steps_per_s")}
                                          for x in meta.get("sessions", [])]
        config = recipe_credit(env)
        settings["credit"] = {k: getattr(config, k) for k in ("episode_norm", "step_norm", "lambda_p", "lambda_m",
                                                               "lambda_t", "g_p", "g_b", "m_min", "prior_strength")}
        variants = cb.default_variants(env, config, candidate=CANDIDATE)
        by_name = {v.name: v for v in variants}
        e = {"settings": settings, "recording": cb.recording_summary(rec), "rows": [], "pairs": {}}
        for name, sub in cb.subsets(rec):
            t0 = time.perf_counter()
            for row in cb.evaluate(sub, variants, n_resamples=args.resamples):
                row = {"env": env, "subset": name, **row}
                e["rows"].append(row)
                csv_rows.append(row)
            e["pairs"][name] = cb.paired_difference(sub, by_name["milegpo-paper"], by_name["milegpo"],
                                                    n_resamples=args.resamples).to_dict()
            print(f"{env} {name}: {len(variants)} variants in {time.perf_counter() - t0:.1f} s", flush=True)
        if not args.no_sweep:
            t0 = time.perf_counter()
            e["sweep"] = [{"env": env, **r} for r in cb.sweep(rec, env, SWEEP_GRID, base=config,
                                                               n_resamples=args.sweep_resamples)]
            print(f"{env} sweep in {time.perf_counter() - t0:.1f} s", flush=True)
        results["envs"][env] = e
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "credit_diagnostics.json").write_text(json.dumps(results, indent=1, default=float) + "\n")
    _write_csv(RESULTS / "credit_diagnostics.csv", csv_rows)
    _write_csv(RESULTS / "credit_sweep.csv", [r for e in results["envs"].values() for r in e.get("sweep", [])])
    Path(args.doc).write_text(credit_bench_report.render_markdown(results) + "\n")
    print(f"wrote {RESULTS / 'credit_diagnostics.csv'} and {args.doc}")


def _write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="record behaviour-policy groups with oracle labels")
    r.add_argument("--env", choices=("alfworld", "webshop"), required=True)
    r.add_argument("--tasks", type=int, required=True, help="tasks; one group per (task, p)")
    r.add_argument("--split", default="train")
    r.add_argument("--p", type=float, nargs="+", default=[0.25, 0.5, 0.75], help="random-action probabilities")
    r.add_argument("--group-size", type=int, default=8)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--max-steps", type=int, default=None, help="default: the recipe's (ALFWorld 30, WebShop 15)")
    r.add_argument("--workers", type=int, default=2, help="ALFWorld engine processes")
    r.add_argument("--budget-min", type=float, default=None, help="stop starting new groups after this")
    a = sub.add_parser("analyse", help="score every estimator on the recordings; write tables and docs")
    a.add_argument("--envs", nargs="+", default=["webshop", "alfworld"])
    a.add_argument("--resamples", type=int, default=1000)
    a.add_argument("--sweep-resamples", type=int, default=200)
    a.add_argument("--no-sweep", action="store_true")
    a.add_argument("--doc", default=str(ROOT / "docs" / "results_credit.md"))
    args = ap.parse_args(argv)  # before any ALFWorld import: Fast Downward overwrites sys.argv
    if args.cmd == "record":
        if args.max_steps is None:
            args.max_steps = {"alfworld": 30, "webshop": 15}[args.env]  # recipes/<env>.toml [env] max_steps
        cmd_record(args)
    else:
        cmd_analyse(args)


if __name__ == "__main__":
    main()
