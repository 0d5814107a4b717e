"""Does PPO improve the policy it starts from? Runs a recipe for several seeds and measures, per
seed and pooled, the held-out gain of the final evaluation over the starting policy (phase
"warmstart"), paired task by task (both evaluate the same fixed task list), and the change of the
expert-action probe.

    python bench/learning.py --recipe alfworld --seeds 0 1 2 --parallel 2 --label alfworld
    python bench/learning.py --recipe webshop --seeds 0 1 2 --label webshop
    python bench/learning.py --recipe alfworld --seeds 0 --label alfworld-from-nothing \
        --set base.enabled=false --set policy.score_norm=mean
    python bench/learning.py --recipe webshop --seeds 0 1 2 3 4 --label webshop-results-v2 \
        --runs-dir runs/results-v2-webshop --experiment 1 --algo milegpo   # reads trained runs only

Writes bench/results/learning_<label>.json (every figure, the commands and the wall time) and the
same table in bench/results/learning_<label>.md (docs/results.md cites these files). Runs go to their own store (``--runs-dir``, default runs/learning-<label>); the
game cache and the cached base policy are shared with runs/ so nothing is built twice. An existing
finished run of the same recipe, overrides and seed in that store is reused (the bench resumes).
``--experiment`` / ``--algo`` read the runs of one method of an experiment in an existing store
(e.g. a results store) instead of training; each seed must then be there exactly once.
Pooled gains carry two intervals: the percentile bootstrap over (seed, task) pairs and a Student t
interval over the per-seed mean gains, which also counts the seed-to-seed spread. The probe's gain is
paired the same way over (seed, probe state) pairs: every evaluation row stores each probe state's
log-probability (``probe_expert_logp_states``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scipy import stats  # noqa: E402

from milegpo_cli.store import RunStore  # noqa: E402
from milegpo_cli.intervals import wilson_interval  # noqa: E402
from milegpo_cli.trainer.evaluation import PROBE_STATE_LOGPS  # noqa: E402

MILEGPO = os.environ.get("MILEGPO", str(ROOT / ".venv" / "bin" / "milegpo"))
RNG = np.random.default_rng(0)


def paired_interval(diffs: np.ndarray, resamples: int = 10_000) -> tuple[float, float]:
    """Percentile bootstrap 95 % interval of the mean of paired differences."""
    if len(diffs) < 2:
        return float("nan"), float("nan")
    means = diffs[RNG.integers(0, len(diffs), (resamples, len(diffs)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def seed_t_interval(diffs_by_seed: list[list[float]]) -> tuple[float, float] | None:
    """Student t 95 % interval of the mean over seeds of each seed's mean paired gain (None: < 2 seeds)."""
    means = np.asarray([np.mean(d) for d in diffs_by_seed])
    if len(means) < 2:
        return None
    half = stats.t.ppf(0.975, len(means) - 1) * means.std(ddof=1) / np.sqrt(len(means))
    return float(means.mean() - half), float(means.mean() + half)


def stored_runs(store, seeds: list[int], experiment: int | None, algo: str | None) -> dict[int, dict]:
    """seed -> the finished run of ``seeds`` in the store (of ``experiment`` and ``algo`` when given)."""
    rows = [r for r in store.list_runs(experiment) if r["status"] == "finished" and r["seed"] in seeds
            and (algo is None or (r["algo"] == algo and not r["drop"]))]
    out: dict[int, dict] = {}
    for r in rows:
        if r["seed"] in out and (experiment is not None or algo is not None):
            raise SystemExit(f"seed {r['seed']}: runs {out[r['seed']]['id']} and {r['id']} both match; "
                             "narrow --experiment / --algo")
        out[r["seed"]] = r
    return out


def train(recipe: str, seed: int, sets: list[str], runs_dir: Path, log: Path) -> float:
    cmd = [MILEGPO, "train", "--recipe", recipe, "--seed", str(seed), "--runs-dir", str(runs_dir),
           "--set", f'env.alfworld.data_dir="{ROOT / "runs" / "alfworld"}"']
    for s in sets:
        cmd += ["--set", s]
    start = time.perf_counter()
    with open(log, "w") as out:
        subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=True,
                       env={**os.environ, "ALFWORLD_DATA": str(ROOT / "runs" / "alfworld_data"), "OMP_NUM_THREADS": "1"})
    return time.perf_counter() - start


def outcomes(store, evaluation: dict) -> dict[str, tuple[float, float]]:
    """task id -> (success, outcome) of one evaluation's episodes."""
    return {e["task_id"]: (float(e["success"]), float(e["outcome"]))
            for e in store.episodes(evaluation["run_id"], evaluation_id=evaluation["id"])}


def probe_diffs(start: dict, final: dict) -> list[float]:
    """Per probe state: final minus start log-probability of the expert's action (the same states, in
    the same order, at both evaluations of a run); [] for runs stored before the per-state values."""
    a, b = start["metrics"].get(PROBE_STATE_LOGPS), final["metrics"].get(PROBE_STATE_LOGPS)
    return [y - x for x, y in zip(a, b)] if a and b and len(a) == len(b) else []


def run_gain(store, run: dict) -> dict:
    """Per split: start vs final evaluation (success, score, probe), paired over tasks."""
    evals = [e for e in store.evaluations(run["id"]) if e["checkpoint"] is None]
    out = {}
    for split in sorted({e["split"] for e in evals}):
        rows = [e for e in evals if e["split"] == split]
        start = next(e for e in rows if e["phase"] == "warmstart")
        final = max((e for e in rows if e["phase"] == "train"), key=lambda e: e["iteration"])
        a, b = outcomes(store, start), outcomes(store, final)
        tasks = sorted(set(a) & set(b))
        out[split] = {
            "start_success": start["success_rate"], "final_success": final["success_rate"],
            "start_ci": wilson_interval(start["success_rate"] * start["episodes"], start["episodes"]),
            "final_ci": wilson_interval(final["success_rate"] * final["episodes"], final["episodes"]),
            "start_score": start["mean_outcome"], "final_score": final["mean_outcome"],
            "start_ended_rate": start["metrics"].get("ended_rate"), "final_ended_rate": final["metrics"].get("ended_rate"),
            "start_outcome_given_ended": start["metrics"].get("outcome_given_ended"),
            "final_outcome_given_ended": final["metrics"].get("outcome_given_ended"),
            "tasks": len(tasks), "final_iteration": final["iteration"],
            "success_diffs": [b[t][0] - a[t][0] for t in tasks], "score_diffs": [b[t][1] - a[t][1] for t in tasks],
            "probe_start": start["metrics"].get("probe_expert_logp"), "probe_final": final["metrics"].get("probe_expert_logp"),
            "probe_acc_start": start["metrics"].get("probe_expert_acc"), "probe_acc_final": final["metrics"].get("probe_expert_acc"),
            "probe_diffs": probe_diffs(start, final),
        }
    return out


def summarise(per_seed: dict[int, dict]) -> dict:
    pooled = {}
    for split in sorted({s for g in per_seed.values() for s in g}):
        rows = [g[split] for g in per_seed.values() if split in g]
        sd = np.concatenate([r["success_diffs"] for r in rows])
        od = np.concatenate([r["score_diffs"] for r in rows])
        pooled[split] = {"pairs": int(len(sd)), "success_gain": float(sd.mean()), "success_gain_ci": paired_interval(sd),
                         "score_gain": float(od.mean()), "score_gain_ci": paired_interval(od),
                         "success_gain_seed_t_ci": seed_t_interval([r["success_diffs"] for r in rows]),
                         "score_gain_seed_t_ci": seed_t_interval([r["score_diffs"] for r in rows]),
                         "probe_gain": [r["probe_final"] - r["probe_start"] for r in rows
                                        if r["probe_final"] is not None and r["probe_start"] is not None]}
        if all(r["probe_diffs"] for r in rows):  # paired over (seed, probe state), like success over (seed, task)
            pd = np.concatenate([r["probe_diffs"] for r in rows])
            pooled[split].update({"probe_pairs": int(len(pd)), "probe_gain_mean": float(pd.mean()),
                                  "probe_gain_ci": paired_interval(pd),
                                  "probe_gain_seed_t_ci": seed_t_interval([r["probe_diffs"] for r in rows])})
    return pooled


def _share(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _interval(ci: tuple[float, float] | None) -> str:
    return "-" if ci is None else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="alfworld")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--label", default=None)
    ap.add_argument("--runs-dir", type=Path, default=None)
    ap.add_argument("--experiment", type=int, default=None, help="read this experiment's runs; train nothing")
    ap.add_argument("--algo", default=None, help="read this algo's runs (no ablation); train nothing")
    args = ap.parse_args()
    label = args.label or args.recipe
    runs_dir = (args.runs_dir or ROOT / "runs" / f"learning-{label}").resolve()
    runs_dir.mkdir(parents=True, exist_ok=True)
    if not (runs_dir / "models").exists():
        (ROOT / "runs" / "models").mkdir(parents=True, exist_ok=True)
        (runs_dir / "models").symlink_to(ROOT / "runs" / "models", target_is_directory=True)
    store = RunStore(f"sqlite:///{runs_dir / 'milegpo.db'}")
    read_only = args.experiment is not None or args.algo is not None
    done = stored_runs(store, args.seeds, args.experiment, args.algo)
    todo = [s for s in args.seeds if s not in done]
    if read_only and todo:
        raise SystemExit(f"seeds {todo}: no finished run in {runs_dir} (--experiment / --algo train nothing)")
    start = time.perf_counter()
    with ThreadPoolExecutor(max(1, args.parallel)) as pool:
        walls = dict(zip(todo, pool.map(lambda s: train(args.recipe, s, args.sets, runs_dir, runs_dir / f"seed{s}.log"),
                                        todo)))
    runs = stored_runs(store, args.seeds, args.experiment, args.algo)
    per_seed = {s: run_gain(store, runs[s]) for s in sorted(runs)}
    result = {"recipe": args.recipe, "sets": args.sets, "experiment": args.experiment, "algo": args.algo,
              "seeds": sorted(runs), "parallel": args.parallel,
              "wall_s_per_run": walls, "wall_s_total": time.perf_counter() - start, "runs_dir": str(runs_dir),
              "per_seed": per_seed, "pooled": summarise(per_seed)}
    out = ROOT / "bench" / "results" / f"learning_{label}.json"
    out.write_text(json.dumps(result, indent=1, default=float))
    source = (f" (runs read from `{runs_dir.name}`" + (f", experiment {args.experiment}" if args.experiment else "")
              + (f", algo {args.algo}" if args.algo else "") + ")") if read_only else ""
    lines = [f"Recipe `{args.recipe}` {' '.join('--set ' + s for s in args.sets)}{source}; seeds {sorted(runs)}; "
             f"wall time per run (s): {', '.join(f'{w:.0f}' for w in walls.values()) or 'reused'}.", "",
             "| seed | split | start success [95% CI] | final success [95% CI] | paired gain [95% CI] | "
             "score start -> final | bought start -> final | probe logp start -> final | tasks |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s, g in per_seed.items():
        for split, r in g.items():
            d = np.asarray(r["success_diffs"])
            lo, hi = paired_interval(d)
            lines.append(f"| {s} | {split} | {r['start_success']:.3f} [{r['start_ci'][0]:.2f}, {r['start_ci'][1]:.2f}] | "
                         f"{r['final_success']:.3f} [{r['final_ci'][0]:.2f}, {r['final_ci'][1]:.2f}] | {d.mean():+.3f} "
                         f"[{lo:+.3f}, {hi:+.3f}] | {r['start_score']:.3f} -> {r['final_score']:.3f} | "
                         f"{_share(r['start_ended_rate'])} -> {_share(r['final_ended_rate'])} | {r['probe_start']:.3f} -> {r['probe_final']:.3f} | {r['tasks']} |")
    lines.append("")
    for split, p in result["pooled"].items():
        lo, hi = p["success_gain_ci"]
        slo, shi = p["score_gain_ci"]
        lines.append(f"- pooled {split}: success gain {p['success_gain']:+.3f} [{lo:+.3f}, {hi:+.3f}] over {p['pairs']} "
                     f"(seed, task) pairs, {_interval(p['success_gain_seed_t_ci'])} over seeds (t); score gain "
                     f"{p['score_gain']:+.3f} [{slo:+.3f}, {shi:+.3f}], {_interval(p['score_gain_seed_t_ci'])} over "
                     f"seeds; probe logp gain per seed {', '.join('%+.3f' % g for g in p['probe_gain'])}"
                     + (f", pooled {p['probe_gain_mean']:+.3f} {_interval(p['probe_gain_ci'])} over {p['probe_pairs']} "
                        f"(seed, state) pairs, {_interval(p['probe_gain_seed_t_ci'])} over seeds (t)"
                        if "probe_gain_mean" in p else ""))
    md = out.with_suffix(".md")
    md.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {out} and {md}")


if __name__ == "__main__":
    main()
