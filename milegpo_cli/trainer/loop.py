"""A training run (`milegpo train`): open or resume the run, then iterate (one iteration:
trainer/iteration.py), evaluate, checkpoint, store + MLflow.

Where PPO starts: the cached base policy (``[base]``, trainer/base_policy.py), else the untrained
model, optionally followed by a per-run supervised warm start (``[warmstart]``). Evaluations
(trainer/evaluation.py) are stored with their phase: ``untrained``, ``warmstart`` (the policy PPO
starts from) and ``train``; the expert-action probe is measured at every iteration.

Reproducibility: every random draw of iteration i derives from (seed, i) — the global RNGs are
reseeded at the start of each iteration, the G training tasks are drawn without replacement from the
seed's PPO pool (trainer/task_pools.py) by ``derive_seed(seed, "tasks", i)``, evaluations run in a
forked RNG seeded from (seed, i) on fixed task lists (the same for every run). So a run resumed from
the checkpoint of iteration k (weights, optimizer, scheduler, RNG states) continues exactly as the
uninterrupted run.

Crash safety (issue 8): per iteration, rows are written in one store transaction before the
checkpoint of that iteration; resuming deletes every row after the checkpoint's iteration, so the
store holds each iteration exactly once. Resuming changes nothing before the checkpoint is verified,
MLflow answers and the run is locked (trainer/resume.py); a run folder may have moved (run_folder.py).

Under ``accelerate launch --num_processes K`` each process plays its own G groups (seeds derived from
its rank), computes their credit and averages its gradients with the others; the main process gathers
every rank's episodes and alone writes the store, MLflow and checkpoints (trainer/distributed.py).
"""
from __future__ import annotations

import contextlib
import time
from functools import partial
from pathlib import Path
from typing import Any

from milegpo_cli.errors import MilegpoError, StoreError
from milegpo_cli.config import Config
from milegpo_cli.run_folder import relative_to_folder, resume_command
from milegpo_cli.trainer.base_policy import ensure_base_policy
from milegpo_cli.trainer.builders import build_policy, build_suite, make_accelerator
from milegpo_cli.trainer.checkpoint import DiskFull, claim_folder, save_checkpoint, set_rng_state
from milegpo_cli.trainer.credit_memory import RunMemory
from milegpo_cli.trainer.distributed import world_size
from milegpo_cli.trainer.episode_records import episode_record
from milegpo_cli.trainer.evaluation import EVAL_ENVS, Probe, evaluation_metrics, format_success, run_evaluation
from milegpo_cli.trainer.iteration import numeric_metrics, train_iteration, train_pool
from milegpo_cli.trainer.provenance import run_name
from milegpo_cli.trainer.resume import checkpoint_root, load_resume, open_run, stopped
from milegpo_cli.trainer.rollout import expert_walkthroughs
from milegpo_cli.trainer.seeding import derive_seed, seed_everything
from milegpo_cli.trainer.shared_start import can_share_start, shared_start
from milegpo_cli.trainer.testbed import check_testbed, testbed_digest
from milegpo_cli.cores import LoadMeter
from milegpo_cli.trainer.threads import ThreadPlan, plan_threads
from milegpo_cli.trainer.task_pools import warmstart_tasks


class TrainError(MilegpoError, RuntimeError):
    """Training cannot go on (e.g. too many consecutive bad updates)."""


def warm_start(config: Config, policy, suite) -> dict[str, float]:
    """Supervised warm start on expert walkthroughs of training tasks (recipe [warmstart])."""
    from milegpo_cli.trainer.warmstart import supervised_warm_start

    ws = config.warmstart
    seed_everything(derive_seed(config.run.seed, "warmstart"))
    tasks = warmstart_tasks(suite, ws.episodes, config.run.seed)
    venv = suite.make_vector_env(min(ws.episodes, config.rollout.groups * config.rollout.group_size), oracle=True)
    try:
        steps, won = expert_walkthroughs(venv, tasks, suite.max_steps)
    finally:
        venv.close()
    out = supervised_warm_start(policy, steps, ws.epochs, ws.lr)
    return {**out, "warmstart_walkthroughs": float(len(tasks)), "warmstart_expert_won": float(won)}



def _progress(console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.fields[status]}"), console=console)


class Evaluator:
    """Evaluations and the probe of one run: stored with their phase, logged to MLflow and printed
    (one line per split, success with its Wilson interval)."""

    def __init__(self, config: Config, suite, venv, probe: Probe, store, tracker, run_id: int, console,
                 threads: ThreadPlan):
        self.config, self.suite, self.venv, self.probe, self.threads = config, suite, venv, probe, threads
        self.store, self.tracker, self.run_id, self.console = store, tracker, run_id, console

    def __call__(self, policy, iteration: int, phase: str,
                 probes: dict[str, dict[str, float]] | None = None) -> dict[str, dict[str, float]]:
        """Evaluate every split; ``probes``: this policy's probe scores when already measured."""
        cfg = self.config
        probes = self.probe.measure(policy) if probes is None else probes
        out = {}
        for split in cfg.eval.splits:
            metrics, played = run_evaluation(cfg, policy, self.venv, self.suite, split, cfg.eval.episodes,
                                             seed=derive_seed(cfg.run.seed, "eval", iteration, split),
                                             threads=self.threads)
            metrics.update(probes.get(split, {}))
            out[split] = metrics
            if self.tracker is not None:  # main process only
                self.store.record_evaluation(self.run_id, split, metrics, [episode_record(e) for e in played],
                                             iteration=iteration, phase=phase)
                self.tracker.log_metrics(evaluation_metrics(split, phase, metrics), step=iteration)
            self._print(phase, iteration, split, metrics)
        return out

    def copy(self, source_run: int, iteration: int, phase: str) -> None:
        """Take ``source_run``'s stored evaluations of (``iteration``, ``phase``) as this run's: its start
        evaluation, shared with a finished run that started exactly like it (trainer/shared_start.py)."""
        for row in self.store.copy_evaluations(source_run, self.run_id, iteration, phase):
            self.tracker.log_metrics(evaluation_metrics(row["split"], phase, row["metrics"]), step=iteration)
            self._print(phase, iteration, row["split"], row["metrics"], f"  (run {source_run}'s, the same start)")

    def _print(self, phase: str, iteration: int, split: str, metrics: dict, note: str = "") -> None:
        probe = f"  probe logp {metrics['probe_expert_logp']:.3f}" if "probe_expert_logp" in metrics else ""
        self.console.print(f"eval {phase} (iteration {iteration}) {split}: success {format_success(metrics)}  "
                           f"outcome {metrics['mean_outcome']:.3f}{probe}{note}", soft_wrap=True)


def starting_policy(config: Config, suite, device, evaluate: Evaluator, run_dir: Path, log,
                    base_folder: Path | None, shared_from: int | None = None) -> tuple[Any, dict[str, float]]:
    """The policy PPO starts from, evaluated as phase "warmstart" (and the untrained model as phase
    "untrained" when it differs and ``eval.untrained``): the cached base policy (``base_folder``, when
    ``base.enabled``) or the untrained model, then the per-run warm start if enabled. ``shared_from``: a
    finished run that started exactly like this one, whose start evaluation is copied instead
    (trainer/shared_start.py). Returns (policy, metrics of how it was made)."""
    from milegpo_cli.policy import Policy
    from milegpo_cli.trainer.base_policy import base_metrics

    metrics: dict[str, float] = {}
    policy = None if config.base.enabled and not config.eval.untrained else build_policy(config, suite, device)
    if (config.base.enabled or config.warmstart.enabled) and config.eval.untrained:
        evaluate(policy, 0, "untrained")
    if base_folder is not None:
        policy = Policy.start_from(base_folder, config.policy, device)
        metrics.update(base_metrics(base_folder))
        log(f"starting from the base policy {base_folder.name}")
    if config.warmstart.enabled:
        metrics.update(warm_start(config, policy, suite))
        run_dir.mkdir(parents=True, exist_ok=True)
        policy.rebase(run_dir / "warmstart_base")  # the KL reference is the warm-started policy
        log(f"warm start on {int(metrics['warmstart_walkthroughs'])} expert walkthroughs "
            f"({int(metrics['warmstart_steps'])} steps)")
    if shared_from is None:
        evaluate(policy, 0, "warmstart")
    else:
        evaluate.copy(shared_from, 0, "warmstart")
        metrics["start_evaluation_from_run"] = float(shared_from)
    return policy, metrics


def iteration_line(it: int, total: int, m: dict[str, float], wall_s: float) -> str:
    """The plain per-iteration log line (printed when stdout is not a terminal)."""
    return (f"iteration {it}/{total}: success {m['success_rate']:.3f}  outcome {m['mean_outcome']:.3f}  "
            f"approx_kl {m.get('approx_kl', float('nan')):.4f}  steps {int(m['steps'])}  {wall_s:.1f} s")


def train(config: Config, store, tracker_uri: str | None = None, resume_run: int | str | None = None,
          console=None) -> int:
    """Train (or resume) a run; returns its store id. See the module docstring for the guarantees."""
    from rich.console import Console

    from milegpo_cli.trainer.ppo import PPOUpdater

    console = console or Console()
    run_id, ckpt = None, None
    if resume_run is not None:  # the stored config, in the caller's run folder; checkpoint verified
        run_id, config, ckpt = load_resume(store, resume_run, config.store.root)
    threads = plan_threads(config)  # torch threads, engine workers, lanes: this process's cores
    threads.apply()
    accelerator = make_accelerator(config)
    main = accelerator.is_main_process  # only the main process writes the store, MLflow and checkpoints
    opened = open_run(config, store, tracker_uri or config.store.mlflow_uri, run_id, ckpt, main, accelerator)
    run_id, tracker = opened.run_id, opened.tracker
    plain = not console.is_terminal  # nohup, CI, a cluster job: one plain line per iteration
    log = partial(console.print, soft_wrap=True)
    meter = LoadMeter()
    G, N = config.rollout.groups, config.rollout.group_size
    suite = venv = eval_venv = None
    try:  # from here on a stop marks the run killed and releases its lock
        if main:  # the run's checkpoint folder: its own, not another store's run of the same id
            claim_folder(checkpoint_root(config, run_id), opened.mlflow_run_id, fresh=ckpt is None)
        suite = build_suite(config, threads.rollout.workers)
        venv = suite.make_vector_env(G * N, oracle=config.env.oracle if config.env.name == "alfworld"
                                     else config.env.oracle != "off")
        eval_venv = suite.make_vector_env(min(config.eval.episodes, EVAL_ENVS), oracle=False)
        seed_everything(derive_seed(config.run.seed, "init"))
        pool = train_pool(config, suite)
        probe = Probe.collect(suite, config.eval.splits, config.eval.episodes, config.eval.probe_states,
                              eval_venv.num_envs, config.run.task_types)
        evaluate = Evaluator(config, suite, eval_venv, probe, store, tracker, run_id, console, threads)
        start = 0
        with accelerator.main_process_first():  # cached models are built by rank 0 (transformers saves only there)
            base = ensure_base_policy(config, suite, accelerator.device, log) if config.base.enabled else None
        testbed = testbed_digest(config, suite, base)
        check_testbed(store, run_id, testbed)  # before anything is evaluated; recorded when the run finishes
        if ckpt is None:
            shared = (shared_start(store, run_id, config, testbed)
                      if can_share_start(config, world_size(accelerator)) else None)
            with accelerator.main_process_first():
                policy, made = starting_policy(config, suite, accelerator.device, evaluate,
                                               checkpoint_root(config, run_id), log, base, shared)
            if made and main:  # iteration 0: how the starting policy was made
                store.record_iteration(run_id, 0, {"phase": "warmstart", **made})
                tracker.log_metrics(numeric_metrics(made), step=0)
        else:
            policy = build_policy(config, suite, accelerator.device, ckpt.policy_dir)
            start = ckpt.iteration
        updater = PPOUpdater(policy, config.ppo, accelerator, total_updates=config.run.iterations, threads=config.run.threads)
        if ckpt is not None:
            updater.load_state_dict(ckpt.trainer_state)
            set_rng_state(ckpt.rng_state)
        bad = 0
        memory = RunMemory(config, store, run_id, start, world_size(accelerator))
        with _progress(console) as progress:
            bar = progress.add_task(f"train {run_name(config)}", total=config.run.iterations, completed=start,
                                    status="")
            for it in range(start + 1, config.run.iterations + 1):
                t0 = time.perf_counter()
                load = threads.follow_load(meter)  # torch threads drop to the cores other processes leave free
                res = train_iteration(config, policy, updater, venv, pool, suite, it, threads=threads, memory=memory.tasks)
                res.metrics.update(load)
                probes = probe.measure(policy)
                for split, values in probes.items():
                    res.metrics.update({f"{k}_{split}": v for k, v in Probe.scalars(values).items()})
                bad = bad + 1 if res.metrics.get("optimizer_steps", 1) == 0 and not res.metrics.get("no_signal") else 0
                if bad:
                    console.print(f"[yellow]iteration {it}: update skipped ({res.metrics.get('skipped_reason', '?')}); "
                                  f"{bad} in a row, training stops at {config.ppo.max_bad_updates}[/yellow]")
                if main:
                    store.record_iteration(run_id, it, res.metrics, res.episodes, res.candidates)
                    memory.keep(store, run_id, it, res.credit)
                    tracker.log_metrics(res.metrics, step=it)
                if plain:
                    log(iteration_line(it, config.run.iterations, res.metrics, time.perf_counter() - t0))
                status = f"success {res.metrics['success_rate']:.2f}"
                if it % config.eval.every == 0 or it == config.run.iterations:
                    evals = evaluate(policy, it, "train", probes)
                    status += "  " + "  ".join(f"{s} {m['success_rate']:.2f}" for s, m in evals.items())
                if it % config.checkpoint.every == 0 or it == config.run.iterations:
                    write_checkpoint(config, store, run_id, it, policy, updater, accelerator)
                progress.update(bar, advance=1, status=status)
                if bad >= config.ppo.max_bad_updates:
                    raise TrainError(f"training stopped: {bad} consecutive updates skipped for non-finite "
                                     f"loss or advantages (last at iteration {it})")
    except BaseException as err:
        if main:
            with contextlib.suppress(StoreError):  # a store that does not answer cannot record the end
                store.set_status(run_id, "killed" if isinstance(err, KeyboardInterrupt) else "failed")
        if tracker is not None:
            tracker.end("KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED",
                        resume_command(run_id, config.store.root, store.url))
        if isinstance(err, KeyboardInterrupt):
            raise stopped(run_id, config, store) from err
        raise
    finally:
        for opened_env in (venv, eval_venv, suite):
            if opened_env is not None:
                opened_env.close()
        if opened.lock is not None:
            opened.lock.release()
    if tracker is not None:  # main process
        store.set_status(run_id, "finished", versions=testbed)
        tracker.end("FINISHED", resume_command(run_id, config.store.root, store.url))
        print_summary(store, run_id, console, score=config.env.name == "webshop")
    return run_id


def write_checkpoint(config: Config, store, run_id: int, iteration: int, policy, updater, accelerator) -> None:
    from milegpo_cli.trainer.checkpoint import MANIFEST, sha256_file

    accelerator.wait_for_everyone()
    if not accelerator.is_main_process:
        return
    try:
        path = save_checkpoint(checkpoint_root(config, run_id), iteration, policy, updater.state_dict(),
                               {"sampler": {"pool": config.rollout.train_tasks, "seed": config.run.seed,
                                            "draw": "derive_seed(seed, 'tasks', iteration)"}}, keep=config.checkpoint.keep)
    except DiskFull as err:
        raise DiskFull(f"{err}: {resume_command(run_id, config.store.root, store.url)}") from None
    store.record_checkpoint(run_id, iteration, relative_to_folder(path, config.store.root), sha256_file(path / MANIFEST))


def print_summary(store, run_id: int, console, score: bool = False) -> None:
    """Per evaluated split: the policy PPO started from (phase "warmstart") against the last
    evaluation, success with its Wilson interval, and the mean outcome when it differs (WebShop)."""
    evals = [e for e in store.evaluations(run_id) if e["checkpoint"] is None and e["iteration"] is not None]
    for split in sorted({e["split"] for e in evals}):
        rows = sorted((e for e in evals if e["split"] == split and e.get("phase") != "untrained"),
                      key=lambda e: e["iteration"])
        if not rows:
            continue
        first, last = rows[0], rows[-1]
        extra = f"  (score {first['mean_outcome']:.3f} -> {last['mean_outcome']:.3f})" if score else ""
        console.print(f"{split}: success {format_success(first)} at the start -> "
                      f"{format_success(last)} at iteration {last['iteration']}{extra}")

