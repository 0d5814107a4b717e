"""Two ablate members trained at once against the same two one after the other, in one run.

    nice -n 10 .venv/bin/python bench/ablate_parallel.py --recipe alfworld --iterations 4 [--set key=value ...]

Runs ``milegpo ablate --seeds 2 --no-ablations`` (the full method on seeds 0 and 1) twice, each time
in a fresh run directory under ``ROOT/bench`` (store, MLflow, checkpoints: a run id of one would
otherwise resume the other's checkpoint), ``ROOT/models`` (the cached base policy) linked in: with ``--parallel 1`` (members one after the other, in the ablate process) and
with ``--parallel 2`` (two member processes, each given half the cores in ``MILEGPO_CORES``).
Evaluations are cut to ``--eval-episodes`` tasks per split so that the figure is mostly training.
Prints wall time of each and ratio = parallel / sequential (target <= 0.6 on an idle 2-core
machine, issue 36); appends a row to bench/results/ablate_parallel.csv.
"""
from __future__ import annotations

import argparse
import csv
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "ablate_parallel.csv"


def ablate(recipe: str, iterations: int, parallel: int, sets: list[str], root: Path, scratch: Path) -> float:
    """Wall seconds of one ``milegpo ablate`` over 2 seeds in its own run directory (store, MLflow,
    checkpoints), the cached models linked in from ``root``."""
    (scratch / "models").symlink_to(root / "models", target_is_directory=True)
    cmd = [sys.executable, "-m", "milegpo_cli", "ablate", "--recipe", recipe, "--seeds", "2", "--no-ablations",
           "--iterations", str(iterations), "--parallel", str(parallel), "--runs-dir", str(scratch),
           "--db", f"sqlite:///{scratch / 'runs.db'}", "--mlflow-uri", f"sqlite:///{scratch / 'mlflow.db'}"]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=HERE.parent)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="alfworld")
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--eval-episodes", type=int, default=12, help="eval.episodes per split (the recipe: 102)")
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--root", default="runs", help="--runs-dir: the cached tiny model and base policy; "
                    "scratch stores go under ROOT/bench")
    args = ap.parse_args()
    os.environ.setdefault("ALFWORLD_DATA", str(HERE.parent / "runs" / "alfworld_data"))
    root = Path(args.root).resolve()
    (root / "bench").mkdir(parents=True, exist_ok=True)
    sets = [f"eval.episodes={args.eval_episodes}", *args.sets]
    # the base policy first, so that neither timing includes building it
    subprocess.run([sys.executable, "-m", "milegpo_cli", "policy", "build-base", "--recipe", args.recipe,
                    "--runs-dir", str(root), *[x for s in sets for x in ("--set", s)]], check=True, cwd=HERE.parent)
    times = {}
    for parallel in (1, 2):
        times[parallel] = ablate(args.recipe, args.iterations, parallel, sets, root,
                                 Path(tempfile.mkdtemp(dir=root / "bench")))
        print(f"--parallel {parallel}: {times[parallel]:.1f} s", flush=True)
    ratio = times[2] / times[1]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout.strip()
    row = {"date": time.strftime("%Y-%m-%d %H:%M"), "commit": commit, "machine": f"{platform.machine()} {os.cpu_count()} cpu",
           "recipe": args.recipe, "sets": " ".join(sets), "iterations": args.iterations,
           "sequential_s": round(times[1], 2), "parallel2_s": round(times[2], 2), "ratio": round(ratio, 4)}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    new = not RESULTS.exists()
    with open(RESULTS, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        if new:
            w.writeheader()
        w.writerow(row)
    print(f"parallel2 / sequential {ratio:.2f}")


if __name__ == "__main__":
    main()
