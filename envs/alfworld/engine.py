"""The real ALFWorld text engine, batched: :class:`AlfworldVectorEnv` spreads N slots over W worker
processes (or Ray actors, ray_workers.py) in contiguous blocks; each worker steps its slots in turn
(one :class:`~envs.alfworld.game_env.GameEnv` each), and ``step_async`` returns while they do, so
the policy can act for some episodes while the engine steps others (trainer/rollout.py, lanes;
docs/performance.md). The engine's memo tables: engine_caches.py; one game and the transition
cache: game_env.py.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Sequence

from envs.alfworld.game_env import ENGINE_HASH_SEED, EngineError, GameEnv, serve, transition_cache
from envs.base import Observation, StepResult, VectorEnv
from envs.os_environ import os_environ


def _worker(conn, experts, max_steps, cache_size) -> None:
    """A worker process's loop. It ends quietly when its parent is gone (a closed pipe), and leaves
    Ctrl-C to the parent, which stops it: no traceback of a worker in the run's log."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    envs: dict[int, GameEnv] = {}
    cache = transition_cache(cache_size) if cache_size else None
    try:
        while True:
            cmd, items = conn.recv()
            if cmd == "close":
                for e in envs.values():
                    e.close()
                conn.send(None)
                return
            conn.send(serve(envs, cache, experts, max_steps, cmd, items))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return


@dataclass
class _Ticket:
    """A request sent to the workers: its id, each worker's items and that worker's generation then;
    ``done`` holds the results of a request run in-process."""

    id: int
    cmd: str
    timeout: float | None
    per: dict[int, list]
    gen: dict[int, int]
    done: dict[int, object] | None = None


class AlfworldVectorEnv(VectorEnv):
    """num_envs episode slots; workers=0 steps them in this process, else in worker processes
    (``backend`` "process") or Ray actors (``backend`` "ray", envs/alfworld/ray_workers.py: each
    asks ``ray_cpus`` CPUs and a little of the custom resource ``ray_resource``, so they run on the
    nodes that carry it) (slots in contiguous blocks; ``step_async`` returns while they step). The expert runs in the first
    ``expert_slots`` slots (None: all); ``cache_size`` > 0 turns the transition cache on (one per
    process, shared by its slots)."""

    RESET_TIMEOUT_S = 120.0
    partial_steps = True

    def __init__(self, num_envs: int, *, expert: str | None = None, max_steps: int = 50,
                 workers: int = -1, step_timeout_s: float = 30.0, expert_slots: int | None = None,
                 cache_size: int = 0, backend: str = "process", ray_resource: str = "", ray_cpus: float = 1.0):
        if num_envs < 1:
            raise ValueError("num_envs: must be >= 1")
        self._n = num_envs
        self.expert, self.max_steps, self.step_timeout_s = expert, max_steps, step_timeout_s
        labelled = num_envs if expert_slots is None else expert_slots
        self.experts = [expert if i < labelled else None for i in range(num_envs)]
        self.cache_size = cache_size
        self.backend, self.ray_resource, self.ray_cpus = backend, ray_resource, ray_cpus
        self._cache = transition_cache(cache_size) if cache_size and workers == 0 else None
        self.workers = min(num_envs, os.cpu_count() or 1) if workers < 0 else min(workers, num_envs)
        self._local: dict[int, GameEnv] = {}
        self._procs: list = [None] * self.workers
        self._conns: list = [None] * self.workers
        self._gen = [0] * self.workers  # replacements of each worker (a replaced one lost its queue)
        self._queued: list[deque] = [deque() for _ in range(self.workers)]  # ticket ids each worker owes
        self._answers: dict[tuple[int, int], list] = {}  # (ticket id, worker) -> answer read early
        self._sent = 0
        self._ctx = mp.get_context("spawn")
        if self.backend == "ray" and self.workers:  # actors that can never be placed: one line, not a 120 s hang
            from envs.alfworld import ray_workers

            ray_workers.check_room(self.workers, ray_resource, ray_cpus)
        for w in range(self.workers):
            self._spawn(w)
        self._active = [False] * num_envs
        self._last: list[Observation | None] = [None] * num_envs
        self.invalid_count = 0

    @property
    def num_envs(self) -> int:
        return self._n

    def _spawn(self, w: int) -> None:
        if self.backend == "ray":
            from envs.alfworld import ray_workers

            self._procs[w], self._conns[w] = ray_workers.spawn(self.experts, self.max_steps, self.cache_size,
                                                               self.ray_resource, self.ray_cpus)
        else:
            parent, child = self._ctx.Pipe()
            proc = self._ctx.Process(target=_worker, args=(child, self.experts, self.max_steps, self.cache_size),
                                     daemon=True)
            with os_environ(PYTHONHASHSEED=ENGINE_HASH_SEED):  # a spawned process starts with this environment
                proc.start()
            child.close()
            self._procs[w], self._conns[w] = proc, parent
        self._gen[w] += 1
        self._queued[w].clear()

    def _worker_of(self, slot: int) -> int:
        """Slots go to workers in contiguous blocks, so the lanes of a pipelined rollout
        (trainer/rollout.py) step in different processes."""
        return slot * self.workers // self._n

    def _submit(self, cmd: str, items: list[tuple[int, str]], timeout: float | None) -> _Ticket:
        """Send each worker its slots' items (in-process: run them now); a ticket for :meth:`_collect`."""
        if self.workers == 0:
            out = {}
            for slot, arg in items:
                env = self._local.setdefault(slot, GameEnv(self.experts[slot], self.max_steps, self._cache))
                try:
                    out[slot] = env.reset(arg) if cmd == "reset" else env.step(arg)
                except Exception:  # noqa: BLE001
                    env.close()
                    out[slot] = EngineError(traceback.format_exc())
            return _Ticket(0, cmd, timeout, {}, {}, done=out)
        per: dict[int, list] = {}
        for slot, arg in items:
            per.setdefault(self._worker_of(slot), []).append((slot, arg))
        for w, its in per.items():
            self._conns[w].send((cmd, its))
        self._sent += 1
        for w in per:
            self._queued[w].append(self._sent)
        return _Ticket(self._sent, cmd, timeout, per, {w: self._gen[w] for w in per})

    def _collect(self, ticket: _Ticket) -> dict[int, object]:
        """{slot: result} of a submitted ticket; each worker answers its requests in order, so the
        answers to older tickets met on the way are kept for them. A hung worker is replaced."""
        if ticket.done is not None:
            return ticket.done
        out = {}
        for w, its in ticket.per.items():
            limit = None if not ticket.timeout else ticket.timeout * len(its)
            try:
                if self._gen[w] != ticket.gen[w]:
                    raise EOFError(f"worker {w} was replaced before it answered")
                while (ticket.id, w) not in self._answers:
                    if not self._conns[w].poll(limit):
                        raise TimeoutError(f"EngineTimeout: worker {w} gave no answer to {ticket.cmd} "
                                           f"within {limit:.1f} s")
                    self._answers[(self._queued[w].popleft(), w)] = self._conns[w].recv()
                for (slot, _), res in zip(its, self._answers.pop((ticket.id, w))):
                    out[slot] = res
            except (TimeoutError, EOFError, OSError) as e:  # hung or dead worker: replace it
                if self._gen[w] == ticket.gen[w]:
                    self._procs[w].kill()
                    self._procs[w].join()
                    self._spawn(w)
                for slot, _ in its:
                    out[slot] = EngineError(f"{type(e).__name__}: {e}")
        return out

    def reset(self, tasks) -> list[Observation]:
        if len(tasks) > self._n:
            raise ValueError(f"reset: {len(tasks)} tasks for {self._n} env slots")
        items = [(i, t.payload["gamefile"]) for i, t in enumerate(tasks)]
        res = self._collect(self._submit("reset", items, self.RESET_TIMEOUT_S))
        errors = [r for r in res.values() if isinstance(r, Exception)]
        if errors:
            raise errors[0]
        self._active = [i < len(tasks) for i in range(self._n)]
        for i, obs in res.items():
            self._last[i] = obs
        return [res[i] for i in range(len(tasks))]

    def step(self, actions: Sequence[str | None]) -> list[StepResult | None]:
        return self.step_async(actions)()

    def step_async(self, actions: Sequence[str | None]):
        items = [(i, a) for i, a in enumerate(actions) if a is not None and self._active[i]]
        ticket = self._submit("step", items, self.step_timeout_s or None)

        def wait() -> list[StepResult | None]:
            out: list[StepResult | None] = [None] * len(actions)
            for i, r in self._collect(ticket).items():
                if isinstance(r, Exception):
                    r = StepResult(observation=self._last[i], reward=0.0, done=True, won=False, score=0.0,
                                   invalid=False, error=str(r))
                self._last[i] = r.observation
                self._active[i] = not r.done
                self.invalid_count += int(r.invalid)
                out[i] = r
            return out
        return wait

    def close(self) -> None:
        for env in self._local.values():
            env.close()
        self._local.clear()
        for w, conn in enumerate(self._conns):
            if conn is None:
                continue
            try:
                conn.send(("close", []))
                conn.poll(5) and conn.recv()
            except (OSError, EOFError, BrokenPipeError):
                pass
            self._procs[w].join(timeout=5)
            if self._procs[w].is_alive():
                self._procs[w].kill()
            self._conns[w] = None
