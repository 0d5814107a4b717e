"""``milegpo ablate --ray local`` against ``--parallel N`` at equal cores, in one run.

The same tiny WebShop ablation (the full method and one ablation x ``--seeds`` seeds, ``run.threads
= 1``) is trained twice from empty runs folders, each with N = this machine's cores members at a time:
``--parallel N`` (local subprocesses) and ``--ray local`` (a Ray cluster of N CPUs started by the
command; each member a Ray task of 1 CPU running the same subprocess). Writes
bench/results/ray_ablate.csv: per mode the wall time and the time per member; the ratio ray /
parallel; Ray's overhead per member = (ray wall - parallel wall) / members x N (the extra time each
member slot pays, cluster start-up included), and the start-up of a local cluster alone.

    python bench/ray_ablate.py [--seeds 2] [--iterations 2] [--out bench/results/ray_ablate.csv]

Run it on a quiet machine: both modes share the cores with anything else running.
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = ["policy.tiny.hidden_size=32", "policy.tiny.num_layers=1", "policy.tiny.num_heads=2",
        "policy.tiny.num_kv_heads=1", "policy.tiny.intermediate_size=64", "policy.tiny.vocab_size=320",
        "policy.max_prompt_tokens=128", "rollout.groups=2", "rollout.group_size=4", "ppo.epochs=1",
        "eval.episodes=4", "eval.every=1", "checkpoint.every=1", "run.threads=1", "env.max_steps=4",
        "env.webshop.num_products=300", "env.webshop.train_instructions=40", "rollout.train_tasks=16",
        "env.webshop.eval_instructions=8", "base.enabled=false", "eval.probe_states=6"]
COLUMNS = ["mode", "cores", "members", "wall_s", "s_per_member", "ratio_to_parallel", "overhead_per_member_s",
           "cluster_start_s"]


def ablate(mode: list[str], root: Path, seeds: int, iterations: int) -> float:
    sets = [a for s in [*TINY, f"run.iterations={iterations}"] for a in ("--set", s)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "milegpo_cli", "ablate", "--recipe", "webshop", *sets, "--drop", "reliability",
                    "--seeds", str(seeds), "--runs-dir", str(root), *mode], env=env, cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def cluster_start(cores: int) -> float:
    """Seconds to start and stop a local Ray cluster of ``cores`` CPUs (what --ray local adds once)."""
    code = ("import time, ray; t = time.perf_counter(); "
            f"ray.init(num_cpus={cores}, include_dashboard=False, object_store_memory=128 * 2**20); "
            "ray.get(ray.remote(lambda: 1).remote()); ray.shutdown(); print(time.perf_counter() - t)")
    env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    return float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                check=True).stdout.split()[-1])


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "ray_ablate.csv")
    args = ap.parse_args(argv)
    cores = os.cpu_count() or 1
    members = 2 * args.seeds
    with tempfile.TemporaryDirectory(prefix="ray_ablate-") as tmp:
        walls = {"parallel": ablate(["--parallel", str(cores)], Path(tmp) / "parallel", args.seeds, args.iterations),
                 "ray": ablate(["--ray", "local"], Path(tmp) / "ray", args.seeds, args.iterations)}
    start = cluster_start(cores)
    rows = [{"mode": mode, "cores": cores, "members": members, "wall_s": round(w, 1),
             "s_per_member": round(w / members, 2), "ratio_to_parallel": round(w / walls["parallel"], 3),
             "overhead_per_member_s": round((w - walls["parallel"]) / members * cores, 2),
             "cluster_start_s": round(start, 1) if mode == "ray" else ""} for mode, w in walls.items()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    for r in rows:
        print(", ".join(f"{k} {v}" for k, v in r.items()))
    print(f"wrote {args.out}")
    return args.out


if __name__ == "__main__":
    main()
