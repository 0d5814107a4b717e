"""Trainer speed in one run: the optimised trainer against its ``--baseline`` (every optimisation of
docs/performance.md off), bare engine speed, the transition cache, update vs a plain loop.

    nice -n 10 .venv/bin/python bench/train_speed.py --recipe alfworld --iterations 2 [--set key=value ...]

Measured, on the recipe's G x N and the same seeds, with the policy PPO starts from in `milegpo
train` (the recipe's cached base policy when [base] is enabled, built first if missing):
- bare engine: steps/s of the vector env on the iteration's games, random admissible actions, no
  policy, no cache, no oracle: the baseline's engine (the first wave's: its two memo tables, no
  grammar shortcuts, a new engine per game) and the optimised engine ("fast");
- per iteration (trainer.iteration.train_iteration + a store write on SQLite), baseline then optimised:
  wall time split into env (waiting for the engines), policy, credit, update and store; rollout
  steps/s; cache hit rate. Baseline = ``env.alfworld.cache=false``, ``env.oracle="all"``, the
  grammar shortcuts off (condition-parse memo, shallow context copies), a new engine per game and
  no logic memo, engines in-process without lanes (``env.alfworld.workers=0``,
  ``rollout.lanes=1``), one torch thread (``run.threads=1``), per-sample scoring in the update
  (``ppo.micro_batch_size=1``) and one block-masked forward over whole rows (``policy.actions.SPLIT_FORWARD``); optimised = the recipe; optimised_1thread = the recipe with
  ``run.threads=1`` (the update on one core: what the second torch thread adds);
- rollout steps/s with the cache off (same policy, same tasks) to isolate the cache;
- update vs plain: the PPOUpdater against a plain transformers forward/backward/AdamW loop over
  the same minibatches of the same tokens (ScoreSample/GenerateSample.num_tokens), same threads,
  both doing what the update must: every minibatch of every epoch (no early stop) and, with
  ``ppo.kl_coef`` > 0, one no-grad forward pass of the reference model over the samples (its time
  counts, its tokens do not);
- peak RSS, cache on: this process plus, per engine worker, the largest worker's peak.
S = baseline iteration time / optimised iteration time; C = optimised rollout steps/s (policy
included) / bare baseline-engine steps/s (also reported against the fast engine:
cache_vs_fast_engine); U = update tokens/s / plain tokens/s; speedup_1thread = baseline /
optimised_1thread iteration time. Appends a row to
bench/results/train_speed.csv; the last line printed is ``speedup S cache_vs_engine C update_vs_plain U``.

    nice -n 10 .venv/bin/python bench/train_speed.py --recipe alfworld --iterations 3 --contend 1

measures the optimised recipe twice in one run, the same iterations from the same policy: idle, then
beside N CPU-bound neighbour processes (``while True: pass``, started and killed by the bench), and
prints busy / idle per iteration part: ``busy/idle with N neighbours: env E policy P update U
iteration I`` (CSV columns ``contend_ratio_*``; ``*_load_others``: the cores other processes kept
busy, as the trainer measured it).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import platform
import random
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import milegpo_cli  # noqa: F401  (first: torch's OpenMP waits passively, as under `milegpo train`)
import numpy as np
import torch
from results_csv import append_row

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "train_speed.csv"
BASELINE = ["env.alfworld.cache=false", 'env.oracle="all"', "ppo.micro_batch_size=1", "run.threads=1",
            "rollout.lanes=1", "env.alfworld.workers=0"]
ONE_THREAD = ["run.threads=1"]  # the optimised recipe with the update on one core, to show what threads add
PARTS = ("time_env_s", "time_policy_s", "time_update_s", "iteration_s")  # the busy / idle ratios of --contend


def plain_loop(model, samples, minibatch_size: int, epochs: int, lr: float, pad_id: int, order, ref=None) -> float:
    """Tokens/s of a plain transformers forward/backward/step loop over the same minibatches; with
    ``ref`` (kl_coef > 0) first a no-grad forward of the reference model over them, as the updater
    must do for its KL term (the time counts, the tokens do not: as in the updater)."""
    from milegpo_cli.policy.actions import pad

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    seqs = [list(s.prompt_ids) + [t for c in getattr(s, "candidate_ids", [getattr(s, "response_ids", [])]) for t in c]
            for s in samples]
    device = next(model.parameters()).device
    tokens, start = 0, time.perf_counter()
    if ref is not None:
        with torch.no_grad():
            for i in range(0, len(seqs), minibatch_size):
                ids, mask = pad(seqs[i:i + minibatch_size], pad_id, left=False, device=device)
                logp = torch.log_softmax(ref(input_ids=ids, attention_mask=mask).logits[:, :-1].float(), -1)
                logp.gather(-1, ids[:, 1:, None])
    model.train()
    for perm in order[:epochs]:
        for i in range(0, len(perm), minibatch_size):
            batch = [seqs[j] for j in perm[i:i + minibatch_size]]
            ids, mask = pad(batch, pad_id, left=False, device=device)
            labels = ids.masked_fill(mask == 0, -100)
            opt.zero_grad(set_to_none=True)
            model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            tokens += sum(len(s) for s in batch)
    return tokens / (time.perf_counter() - start)


def bare_engine(suite, tasks, group_size: int) -> float:
    """Steps/s of the vector env alone: random admissible actions, no cache, no oracle."""
    from envs.alfworld.engine import AlfworldVectorEnv

    venv = AlfworldVectorEnv(len(tasks) * group_size, max_steps=suite.max_steps, workers=suite.config.workers)
    rng = random.Random(0)
    try:
        obs = venv.reset([t for t in tasks for _ in range(group_size)])
        acts = [rng.choice(o.admissible) for o in obs]
        n, t0 = 0, time.perf_counter()
        while any(a is not None for a in acts):
            res = venv.step(acts)
            n += sum(r is not None for r in res)
            acts = [None if r is None or r.done else rng.choice(r.observation.admissible) for r in res]
        return n / (time.perf_counter() - t0)
    finally:
        venv.close()


class Trainer:
    """One configuration: suite, vector env, policy, updater and a SQLite store."""

    def __init__(self, recipe: str, sets: list[str], root: str):
        from milegpo_cli.config import load_config
        from milegpo_cli.cores import LoadMeter
        from milegpo_cli.store import RunStore
        from milegpo_cli.trainer import builders, iteration as one_iteration, seeding
        from milegpo_cli.trainer.ppo import PPOUpdater
        from milegpo_cli.trainer.threads import plan_threads

        self.one_iteration, self.seeding = one_iteration, seeding
        # as `milegpo train`: workers, lanes and threads sized to the cores, threads following the load
        self.config = c = load_config(recipe, [*sets, f'store.root="{root}"'])
        self.threads, self.meter = plan_threads(c), LoadMeter()
        self.threads.apply()
        self.suite = builders.build_suite(c, self.threads.rollout.workers)
        G, N = c.rollout.groups, c.rollout.group_size
        self.venv = self.suite.make_vector_env(G * N, oracle=c.env.oracle)
        device = builders.make_accelerator(c).device
        if c.base.enabled:  # as `milegpo train`: PPO starts from the recipe's cached base policy
            from milegpo_cli.policy import Policy
            from milegpo_cli.trainer.base_policy import ensure_base_policy

            self.policy = Policy.start_from(ensure_base_policy(c, self.suite, device), c.policy, device)
        else:
            self.policy = builders.build_policy(c, self.suite, device)
        self.updater = PPOUpdater(self.policy, c.ppo, builders.make_accelerator(c), total_updates=100, threads=c.run.threads)
        self.pool = one_iteration.train_pool(c, self.suite)
        (Path(root) / "bench").mkdir(parents=True, exist_ok=True)
        self.store = RunStore(Path(tempfile.mkdtemp(dir=Path(root) / "bench")) / "runs.db")
        self.run_id = self.store.create_run(name="bench", algo=c.run.algo, seed=c.run.seed, config=c.to_dict())

    def iteration(self, it: int) -> dict:
        load = self.threads.follow_load(self.meter)
        m = self.one_iteration.train_iteration(self.config, self.policy, self.updater, self.venv, self.pool, self.suite, it,
                                               threads=self.threads)
        m.metrics.update(load)
        t0 = time.perf_counter()
        self.store.record_iteration(self.run_id, it, m.metrics, m.episodes, m.candidates)
        m.metrics["time_store_s"] = time.perf_counter() - t0
        return m.metrics

    def close(self) -> None:
        self.venv.close()
        self.suite.close()
        self.store.close()


def breakdown(rows: list[dict]) -> dict:
    keys = ("time_env_s", "time_policy_s", "time_credit_s", "time_update_s", "time_store_s")
    out = {k: float(np.mean([r[k] for r in rows])) for k in keys}
    out["iteration_s"] = float(np.mean([r["time_rollout_s"] + r["time_credit_s"] + r["time_update_s"] + r["time_store_s"]
                                        for r in rows]))
    out["rollout_steps_per_s"] = sum(r["steps"] for r in rows) / sum(r["time_rollout_s"] for r in rows)
    out["cache_hit_rate"] = float(np.mean([r["cache_hit_rate"] for r in rows]))
    out["load_others"] = float(np.mean([r["host_load_others"] for r in rows]))  # cores other processes kept busy
    out["cores_free"] = float(np.mean([r["host_cores_free"] for r in rows]))
    return out


def contend_ratios(idle: dict, busy: dict) -> dict:
    """busy / idle time of each iteration part (env, policy, update, the whole iteration)."""
    return {f"contend_ratio_{k.removeprefix('time_').removesuffix('_s')}": busy[k] / idle[k] if idle[k] > 0 else float("nan")
            for k in PARTS}


def spinners(n: int) -> list[int]:
    """The pids of ``n`` CPU-bound neighbour processes (``while True: pass``), detached from this process
    (re-parented to init), so that the trainer's load meter counts them as other processes, as it
    would a user's notebook; a child of the bench would count as the trainer's own load."""
    loop = f'{shlex.quote(sys.executable)} -c "while True: pass" </dev/null >/dev/null 2>&1 & echo $!; '
    out = subprocess.run(["sh", "-c", loop * n], capture_output=True, text=True, check=True).stdout
    return [int(pid) for pid in out.split()]


def stop(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def update_vs_plain(tr, results: dict) -> None:
    """The updater against the plain loop on the same samples and minibatch order, interleaved. Both
    run every minibatch of every epoch (no early stop: ``ppo.target_kl`` = 0 here) and, when
    ``kl_coef`` > 0, one reference forward pass over the samples."""
    from milegpo_cli.trainer.ppo import PPOUpdater
    from milegpo_cli.trainer.rollout import reward_penalty, run_episodes

    c = tr.config
    tr.seeding.seed_everything(1)
    eps = run_episodes(tr.policy, tr.venv, tr.suite.tasks("train", c.rollout.groups, seed=12345), c.rollout.group_size,
                       max_steps=tr.suite.max_steps, success_reward=c.rollout.success_reward,
                       invalid_penalty=reward_penalty(c))
    samples = [s for e in eps if not e.errored for s in e.samples]
    adv = np.random.default_rng(0).standard_normal(len(samples))
    policy = tr.policy  # the trainer's last use
    updater = PPOUpdater(policy, dataclasses.replace(c.ppo, target_kl=0.0), tr.updater.accelerator, total_updates=100,
                         threads=c.run.threads)
    trainer_tps, plain_tps = [], []
    for rep in range(2):
        torch.manual_seed(rep)
        m = updater.update(samples, adv)
        trainer_tps.append(m["tokens"] / m["time_s"])
        torch.manual_seed(rep)
        order = [torch.randperm(len(samples)).tolist() for _ in range(c.ppo.epochs)]
        plain_tps.append(plain_loop(policy.model, samples, c.ppo.minibatch_size, c.ppo.epochs, c.ppo.lr, policy.pad_id,
                                    order, ref=policy.ref_model if c.ppo.kl_coef > 0 else None))
    results["update"] = {"update_tokens_per_s": float(np.median(trainer_tps)),
                         "plain_tokens_per_s": float(np.median(plain_tps))}


def cache_off_rollout(tr, results: dict) -> None:
    """The same rollouts with the cache off (a fresh vector env: no shared cache)."""
    from milegpo_cli.trainer.rollout import RolloutStats, run_episodes
    c = tr.config
    tr.venv.close()
    tr.suite.config = dataclasses.replace(c.env.alfworld, cache=False)
    tr.venv = tr.suite.make_vector_env(c.rollout.groups * c.rollout.group_size, oracle=c.env.oracle)
    stats = RolloutStats()
    tr.seeding.seed_everything(1)
    t0 = time.perf_counter()
    with tr.threads.rolling_out():
        run_episodes(tr.policy, tr.venv, tr.one_iteration.sample_tasks(tr.pool, c.rollout.groups, c.run.seed, 1),
                     c.rollout.group_size, max_steps=tr.suite.max_steps, success_reward=c.rollout.success_reward,
                     invalid_penalty=c.policy.invalid_penalty, stats=stats, lanes=tr.threads.rollout.lanes)
    results["optimised"]["rollout_steps_per_s_cache_off"] = stats.steps / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="alfworld")
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--root", default="runs", help="store.root: the cached tiny model and base policy "
                    "(shared with `milegpo train`); scratch stores go under ROOT/bench")
    ap.add_argument("--baseline", action="store_true", help="measure the baseline path only (every optimisation off)")
    ap.add_argument("--contend", type=int, default=0, metavar="N",
                    help="measure the optimised recipe idle, then beside N CPU-bound neighbour processes, and "
                    "report busy / idle per iteration part (instead of S, C, U)")
    ap.add_argument("--results", type=Path, default=RESULTS, help="CSV the row is appended to")
    args = ap.parse_args(argv)
    if args.contend < 0:
        ap.error("--contend: must be >= 0")
    os.environ.setdefault("ALFWORLD_DATA", str(HERE.parent / "runs" / "alfworld_data"))
    Path(args.root).mkdir(parents=True, exist_ok=True)
    from envs.alfworld import engine_caches
    from milegpo_cli.policy import actions

    torch.set_num_threads(1)
    results: dict[str, dict] = {}
    if args.contend:
        configs = {"optimised": [], "contended": []}
    elif args.baseline:
        configs = {"baseline": BASELINE}
    else:
        configs = {"baseline": BASELINE, "optimised": [], "optimised_1thread": ONE_THREAD}
    for name, sets in configs.items():
        fast = name != "baseline"
        engine_caches.install_engine_caches(True, grammar=fast, reuse=fast)
        actions.SPLIT_FORWARD = fast
        neighbours = spinners(args.contend) if name == "contended" else []
        try:
            tr = Trainer(args.recipe, [*args.sets, *sets], args.root)
            c = tr.config
            tasks = tr.one_iteration.sample_tasks(tr.pool, c.rollout.groups, c.run.seed, 1)
            bare = bare_engine(tr.suite, tasks, c.rollout.group_size)  # also gives the trainer's workers time to start
            if name in ("baseline", "optimised"):
                results.setdefault("bare", {})[name] = bare
            rows = []
            for it in range(1, args.iterations + 1):
                m = tr.iteration(it)
                rows.append(m)
                print(f"{name} iteration {it}: {m['steps']:.0f} steps, env {m['time_env_s']:.2f}s, policy "
                      f"{m['time_policy_s']:.2f}s, credit {m['time_credit_s'] * 1e3:.1f}ms, update {m['time_update_s']:.2f}s, "
                      f"store {m['time_store_s']:.2f}s, cache hits {m['cache_hit_rate']:.2f}, others' load "
                      f"{m['host_load_others']:.2f} cores, {m['host_cores_free']:.0f} free", flush=True)
            results[name] = breakdown(rows)
            if name == "optimised" and not args.contend:
                rss_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                cache_off_rollout(tr, results)
                update_vs_plain(tr, results)
            tr.close()
        finally:
            stop(neighbours)
        if name == "optimised" and not args.contend:  # the engine workers have exited: the largest one's peak, once per worker
            worker_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
            results["optimised"]["peak_rss_mb"] = rss_self + tr.threads.rollout.workers * worker_mb
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=HERE).stdout.strip()
    out = {"date": time.strftime("%Y-%m-%d %H:%M"), "commit": commit,
           "machine": f"{platform.machine()} {os.cpu_count()} cpu", "recipe": args.recipe,
           "sets": " ".join(args.sets), "iterations": args.iterations, "baseline_only": args.baseline,
           "contend": args.contend}
    for name in configs:
        for k, v in results.get(name, {}).items():
            out[f"{name}_{k}"] = v
    if args.contend:
        out.update(contend_ratios(results["optimised"], results["contended"]))
        last = " ".join(f"{k.removeprefix('contend_ratio_')} {out[k]:.2f}" for k in out if k.startswith("contend_ratio_"))
        last = f"busy/idle with {args.contend} neighbours: {last}"
    else:
        base = results["baseline"]
        opt = results.get("optimised", base)
        upd = results.get("update", {"update_tokens_per_s": float("nan"), "plain_tokens_per_s": float("nan")})
        bare = results["bare"]
        S = base["iteration_s"] / opt["iteration_s"]
        C = opt["rollout_steps_per_s"] / bare["baseline"]
        U = upd["update_tokens_per_s"] / upd["plain_tokens_per_s"]
        one = results.get("optimised_1thread", {"iteration_s": float("nan")})
        out.update(bare_engine_steps_per_s=bare["baseline"],
                   bare_fast_engine_steps_per_s=bare.get("optimised", float("nan")),
                   cache_vs_fast_engine=opt["rollout_steps_per_s"] / bare.get("optimised", float("nan")), **upd,
                   speedup=S, cache_vs_engine=C, update_vs_plain=U, speedup_1thread=base["iteration_s"] / one["iteration_s"])
        last = f"speedup {S:.2f} cache_vs_engine {C:.2f} update_vs_plain {U:.2f}"
    out = {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}
    for k, v in out.items():
        print(f"{k:>42}: {v}")
    append_row(args.results, out)
    print(last)


if __name__ == "__main__":
    main()
