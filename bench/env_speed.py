"""Environment speed: reset / step latency, group-of-8 throughput, memory per env.

    python bench/env_speed.py --env alfworld|webshop|all [--games 3] [--steps 60]

Writes bench/results/env_speed.csv (one row per measurement: env, metric, value, unit, detail).
ALFWorld: generated games of the default scene size; random admissible actions.
WebShop: ``envs.webshop.bench:bench_webshop()`` (a dict of figures, turned into rows here).
"""
from __future__ import annotations

import argparse
import csv
import importlib
import os
import random
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "env_speed.csv")


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _random_episode(env, task, rng, steps: int) -> list[float]:
    obs = env.reset(task)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        res = env.step(rng.choice(obs.admissible))
        times.append(time.perf_counter() - t)
        obs = res.observation
        if res.done:
            obs = env.reset(task)
    return times


def _group_throughput(suite, task, workers: int, group: int, rng) -> tuple[float, float]:
    """(seconds for a reset of the group, steps/s of random play of the group to max_steps)."""
    from envs.alfworld.engine import AlfworldVectorEnv
    ve = AlfworldVectorEnv(group, workers=workers, max_steps=suite.max_steps)
    try:
        ve.reset([task] * group)  # warm: workers started, game loaded in each slot
        t = time.perf_counter()
        obs = ve.reset([task] * group)
        t_reset = time.perf_counter() - t
        acts = [rng.choice(o.admissible) for o in obs]
        n, t = 0, time.perf_counter()
        while any(a is not None for a in acts):
            res = ve.step(acts)
            n += sum(r is not None for r in res)
            acts = [None if r is None or r.done else rng.choice(r.observation.admissible) for r in res]
        return t_reset, n / (time.perf_counter() - t)
    finally:
        ve.close()


def bench_alfworld(games: int = 3, steps: int = 60, group: int = 8) -> list[dict]:
    from envs.alfworld import AlfworldConfig, AlfworldSuite
    from envs.alfworld import engine_caches, game_env
    rows: list[dict] = []

    def row(metric, value, unit, detail=""):
        rows.append({"env": "alfworld", "metric": metric, "value": round(value, 4), "unit": unit,
                     "detail": detail})
        print(f"alfworld {metric:28s} {value:10.3f} {unit:6s} {detail}", flush=True)

    suite = AlfworldSuite(AlfworldConfig())
    t = time.perf_counter()
    tasks = suite.tasks("train", games)
    row("generate_per_game", (time.perf_counter() - t) / games, "s", "incl. expert verification (0 if cached)")
    rng = random.Random(0)
    for caches in (False, True):
        engine_caches.install_engine_caches(caches)
        tag = "caches on" if caches else "caches off"
        loads, resets, steps_t = [], [], []
        for task in tasks:
            env = game_env.GameEnv(None, suite.max_steps)
            t = time.perf_counter()
            env.reset(task.payload["gamefile"])
            loads.append(time.perf_counter() - t)
            for _ in range(3):
                t = time.perf_counter()
                env.reset(task.payload["gamefile"])
                resets.append(time.perf_counter() - t)
            steps_t += _random_episode(_Single(env, task), task, rng, steps)
            env.close()
        row("load_and_reset", statistics.mean(loads), "s", tag)
        row("reset_same_game", statistics.mean(resets), "s", tag)
        row("step_mean", 1000 * statistics.mean(steps_t), "ms", tag)
        row("step_p95", 1000 * sorted(steps_t)[int(0.95 * len(steps_t))], "ms", tag)
    engine_caches.install_engine_caches(True)
    oracle_env = game_env.GameEnv(suite.config.expert, suite.max_steps)
    times = _random_episode(_Single(oracle_env, tasks[0]), tasks[0], rng, steps)
    oracle_env.close()
    row("step_mean_oracle", 1000 * statistics.mean(times), "ms", f"expert={suite.config.expert}")
    for workers in (0, 2, group):
        t_reset, sps = _group_throughput(suite, tasks[0], workers, group, rng)
        row("group8_reset", t_reset, "s", f"workers={workers}")
        row("group8_steps_per_s", sps, "1/s", f"workers={workers}")
    rss0 = _rss_mb()
    envs = []
    for i in range(20):
        e = game_env.GameEnv(None, suite.max_steps)
        e.reset(tasks[i % len(tasks)].payload["gamefile"])
        envs.append(e)
    row("memory_per_env", (_rss_mb() - rss0) / len(envs), "MB", "20 loaded envs in one process")
    for e in envs:
        e.close()
    return rows


class _Single:
    """A GameEnv seen through the reset(task)/step(action) shape used by _random_episode."""

    def __init__(self, env, task):
        self.env, self.task = env, task

    def reset(self, task):
        return self.env.reset(task.payload["gamefile"])

    def step(self, action):
        return self.env.step(action)


def bench_webshop_rows() -> list[dict]:
    try:
        mod = importlib.import_module("envs.webshop.bench")
    except ImportError:
        print("webshop: envs.webshop.bench not available, skipped")
        return []
    fn = getattr(mod, "bench_webshop", None)
    if fn is None:
        print("webshop: envs.webshop.bench has no bench_webshop(), skipped")
        return []
    units = {"build_s": "s", "steps_per_s": "1/s", "steps_per_s_oracle": "1/s", "reset_ms": "ms",
             "reset_ms_new_task": "ms", "reset_ms_oracle": "ms", "mean_episode_steps": "steps"}
    return [{"env": "webshop", "metric": k, "value": round(float(v), 4), "unit": units.get(k, ""),
             "detail": "single process, random admissible actions"}
            for k, v in fn().items() if isinstance(v, (int, float))]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", choices=("alfworld", "webshop", "all"), default="all")
    p.add_argument("--games", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--out", default=RESULTS)
    args = p.parse_args(argv)
    argv_saved = sys.argv[:]  # loading ALFWorld games overwrites sys.argv
    rows = []
    if args.env in ("alfworld", "all"):
        rows += bench_alfworld(args.games, args.steps)
    if args.env in ("webshop", "all"):
        rows += bench_webshop_rows()
    sys.argv[:] = argv_saved
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    keep = []
    if os.path.exists(args.out):  # keep the other environment's rows
        envs = {r["env"] for r in rows}
        with open(args.out) as f:
            keep = [r for r in csv.DictReader(f) if r["env"] not in envs]
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["env", "metric", "value", "unit", "detail"], extrasaction="ignore")
        w.writeheader()
        w.writerows(keep + rows)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
