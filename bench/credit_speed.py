"""Time every credit estimator on synthetic batches of 1e3 .. 1e6 steps (issue 3).

Synthetic groups: 8 rollouts of a biased random walk on a 20-state corridor (actions fwd / back /
stay, success on reaching state 12 within 50 steps, reward 10 on the winning step), so groups hold
shared states, loops, milestones and traps as real batches do. Prints steps/s and the MileGPO /
GiGPO time ratio measured in the same run (estimator alone, and with the shared batch build that
interns state keys, which every estimator needs); writes bench/results/credit_speed.csv.

    .venv/bin/python bench/credit_speed.py [--sizes 1000 10000 100000 1000000] [--repeats 3]
"""
from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import numpy as np

from milegpo_cli.credit import CreditConfig, Rollout, RolloutBatch, compute_advantages

GROUP_SIZE, MAX_STEPS, GOAL = 8, 50, 12
MOVES = {"fwd": 1, "back": -1, "stay": 0}


def synthetic_rollouts(num_steps: int, seed: int = 0) -> list[Rollout]:
    """Groups of random-walk rollouts until about ``num_steps`` steps are collected."""
    rng = np.random.default_rng(seed)
    names = np.array(list(MOVES))
    rollouts, total, g = [], 0, 0
    while total < num_steps:
        n = GROUP_SIZE
        acts = rng.choice(3, size=(n, MAX_STEPS), p=[0.5, 0.25, 0.25])
        delta = np.array(list(MOVES.values()))[acts]
        pos = np.zeros((n, MAX_STEPS + 1), dtype=int)
        for t in range(MAX_STEPS):
            pos[:, t + 1] = np.maximum(pos[:, t] + delta[:, t], 0)
        for i in range(n):
            hit = np.flatnonzero(pos[i, 1:] >= GOAL)
            length = int(hit[0]) + 1 if hit.size else MAX_STEPS
            length = min(length, max(num_steps - total, 1))
            won = bool(hit.size) and length == int(hit[0]) + 1
            rewards = [0.0] * length
            if won:
                rewards[-1] = 10.0
            rollouts.append(Rollout(group=f"g{g}", rollout_id=i, states=[f"room {p}" for p in pos[i, :length]],
                                    actions=list(names[acts[i, :length]]), rewards=rewards, outcome=float(won)))
            total += length
        g += 1
    return rollouts


def best_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000, 1_000_000])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "credit_speed.csv"))
    args = ap.parse_args()
    variants = [("grpo", "v3"), ("gigpo", "v3"), ("graphgpo", "v3"), ("milegpo", "v3"), ("milegpo", "v2"),
                ("milegpo", "paper")]
    rows = []
    for size in args.sizes:
        rollouts = synthetic_rollouts(size)
        t0 = time.perf_counter()
        batch = RolloutBatch.from_rollouts(rollouts)
        build = time.perf_counter() - t0
        n = batch.num_steps
        rows.append({"steps": n, "algo": "batch_build", "formulation": "", "seconds": build,
                     "steps_per_s": n / build, "ratio_to_gigpo": "", "ratio_to_gigpo_with_build": ""})
        times = {}
        for algo, form in variants:
            cfg = CreditConfig(formulation=form)
            times[(algo, form)] = best_time(lambda: compute_advantages(batch, algo, cfg), args.repeats)
        for (algo, form), sec in times.items():
            rows.append({"steps": n, "algo": algo, "formulation": form, "seconds": sec, "steps_per_s": n / sec,
                         "ratio_to_gigpo": sec / times[("gigpo", "v3")],
                         "ratio_to_gigpo_with_build": (build + sec) / (build + times[("gigpo", "v3")])})
        line = "  ".join(f"{a}{'/' + f if a == 'milegpo' else ''} {n / s:,.0f}/s" for (a, f), s in times.items())
        mile, gig = times[("milegpo", "v3")], times[("gigpo", "v3")]
        print(f"{n:>9,} steps ({batch.num_groups} groups)  build {n / build:,.0f}/s  {line}  milegpo/gigpo {mile / gig:.2f}"
              f" (with batch build {(build + mile) / (build + gig):.2f})", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
