"""The real ALFWorld text engine (textworld PddlEnv + ALFWorld's wrappers), batched.

:class:`GameEnv` plays one episode at a time on one loaded game, reloading only when the game
changes (a group's N rollouts of one task reset without reloading). :class:`AlfworldVectorEnv`
spreads N slots over W worker processes in contiguous blocks; each worker steps its slots in turn,
and ``step_async`` returns while they do, so the policy can act for some episodes while the
engine steps others (trainer/rollout.py, lanes; docs/performance.md).

Four process-wide memo tables make the engine cheaper without changing what it computes (measured
in bench/env_speed.py, bench/train_speed.py): the PDDL -> SAS translation of a problem (done twice
per reset by ``PddlState``), the parse of a game's logic document (its actions and grammar, parsed
at every load: the N slots of a group load the same game), the parse of grammar strings and the
parse of grammar conditions (textworld parses every rule text and every condition with tatsu on
each derivation). All are keyed on their full input text. Another shortcut copies derivation
contexts shallowly (textworld deep-copies the entities of every context it forks, though the grammar
only reads them).

On top of them, an exact transition cache (:class:`TransitionCache`, ``env.alfworld.cache``):
(game, expert, full engine state, command) -> (feedback text, next state), where the full engine
state is the set of PDDL facts (the engine's outputs -- text, admissible commands, win, planner
plan -- are functions of it and the command). A hit does not advance the real engine: the env
keeps a logical state, and on a miss first brings the engine there by the cheapest known path
(:meth:`GameEnv._materialise`). The handcoded expert keeps a memory of the episode, so envs that
run it bypass the cache.
"""
from __future__ import annotations

import copy
import functools
import json
import multiprocessing as mp
import os
import random
import signal
import sys
import traceback
import zlib
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Sequence

os.environ.setdefault("ALFWORLD_DATA", os.path.abspath(os.path.join("runs", "alfworld_data")))

import fast_downward  # noqa: E402
import textworld  # noqa: E402
import textworld.envs.pddl.logic as _pddl_logic  # noqa: E402
import textworld.envs.pddl.textgen as _textgen  # noqa: E402
from alfworld.agents.environment.alfred_tw_env import (  # noqa: E402
    AlfredDemangler, AlfredExpert, AlfredInfos)
import alfworld.agents.expert.handcoded_expert as _handcoded  # noqa: E402

from envs.alfworld import oracle  # noqa: E402
from envs.base import Observation, StepResult, VectorEnv  # noqa: E402
from envs.faults import fault_point  # noqa: E402

BANNER = "-= Welcome to TextWorld, ALFRED! =-"
TASK_PREFIX = "Your task is to: "
DROPPED_COMMANDS = ("help",)  # verl-agent drops `help` from ALFWorld's admissible commands


class EngineError(RuntimeError):
    """The engine failed while loading / resetting a game (traceback in the message)."""


# ----------------------------------------------------------------------------- engine caches

_pddl2sas = fast_downward.pddl2sas
_parse_and_convert = _textgen._parse_and_convert
_logic_parse = _pddl_logic._parse_and_convert


@functools.lru_cache(maxsize=64)
def _cached_pddl2sas(domain: str, problem: str, verbose: bool, optimize: bool):
    argv = sys.argv[:]
    try:
        return _pddl2sas(domain, problem, verbose=verbose, optimize=optimize)
    finally:
        sys.argv[:] = argv  # the translator overwrites sys.argv


def _pddl2sas_memo(domain, problem, verbose=False, optimize=False):
    return _cached_pddl2sas(domain, problem, verbose, optimize)


@functools.lru_cache(maxsize=4096)
def _parse_cached(text: str, rule_name: str):
    return _parse_and_convert(text, rule_name=rule_name)


def _parse_memo(text, rule_name="symbols", **kwargs):
    if kwargs.get("trace"):
        return _parse_and_convert(text, rule_name=rule_name, **kwargs)
    return copy.deepcopy(_parse_cached(text, rule_name))  # callers attach contexts to the symbols


@functools.lru_cache(maxsize=64)
def _logic_cached(text: str, rule_name: str):
    return _logic_parse(text, rule_name=rule_name)


def _logic_memo(text, rule_name="pddlStart", **kwargs):
    """The parse of a game's logic document (its actions and grammar), once per game text: the N
    slots of a group load the same game."""
    if kwargs:
        return _logic_parse(text, rule_name=rule_name, **kwargs)
    return copy.deepcopy(_logic_cached(text, rule_name))  # GameLogic keeps (and may change) what it gets


_parse_query = _textgen.Rule.parse_conjunctive_query.__func__


@functools.lru_cache(maxsize=4096)
def _query_cached(expr: str):
    return _parse_query(_textgen.Rule, expr)


def _query_memo(cls, expr):
    return _query_cached(expr)  # Rule objects are only read by State.all_assignments


_copy_context = _textgen.copy_context


def _copy_context_shallow(context):
    """textgen.copy_context without its deep copies of the variables and the mapping: the grammar
    only reads the entities and mapping values ({o.name}-style attribute access; State.all_assignments)
    and a copy's two dicts only get new keys (textgen.query), so every derived text is the same."""
    return {"state": context["state"], "facts": context["facts"], "variables": dict(context["variables"]),
            "mapping": dict(context["mapping"]), "entity_infos": context["entity_infos"]}


_REUSE_ENGINES = True  # GameEnv._load: load the next game into the slot's engine (install_engine_caches)


def install_engine_caches(enabled: bool = True, grammar: bool | None = None, reuse: bool | None = None) -> None:
    """Memo tables on (``enabled``) or off; ``grammar`` (default: ``enabled``) for the two grammar
    shortcuts alone: the condition-parse memo and the shallow derivation-context copies; ``reuse``
    (default: ``enabled``) for cheaper game loads: a slot loads its next game into its engine instead
    of starting a new one, and a game's logic document is parsed once (the logic memo)."""
    global _REUSE_ENGINES
    fast_downward.pddl2sas = _pddl2sas_memo if enabled else _pddl2sas
    _textgen._parse_and_convert = _parse_memo if enabled else _parse_and_convert
    grammar = enabled if grammar is None else grammar
    _textgen.Rule.parse_conjunctive_query = classmethod(_query_memo if grammar else _parse_query)
    _textgen.copy_context = _copy_context_shallow if grammar else _copy_context
    _REUSE_ENGINES = enabled if reuse is None else reuse
    _pddl_logic._parse_and_convert = _logic_memo if _REUSE_ENGINES else _logic_parse


install_engine_caches()

# The handcoded expert breaks ties with its module's `random`. Each game has its own generator,
# seeded from the game at every reset and installed before each of its engine calls, so that a
# walkthrough does not depend on the games stepped beside it in the same process (slots, workers).
_handcoded.random = random.Random(0)


# ----------------------------------------------------------------------------- one game

def split_intro(text: str) -> tuple[str, str]:
    """(observation text without banner and task line, "Your task is to: ...")."""
    text = text.replace(BANNER, "").strip()
    task = ""
    lines = []
    for line in text.splitlines():
        if line.startswith(TASK_PREFIX):
            task = line.strip()
        elif line.strip():
            lines.append(line.strip())
    return "\n".join(lines), task


@dataclass(frozen=True)
class EngineState:
    """What the engine shows in one state (a function of its PDDL facts)."""

    sid: int  # index of the fact set in the TransitionCache's table for this game
    admissible: tuple[str, ...]
    won: bool
    facts: oracle.Facts
    plan: tuple[str, ...] | None  # the expert's plan (planner expert), else None


class TransitionCache:
    """Exact, bounded memo of the engine: (game, expert, fact set, command) -> (feedback, next state).

    ``size`` bounds the transitions (least recently used evicted first); the fact-set table and the
    shortest known command path from the reset to each state are kept per game. ``hits``/``misses``
    count the lookups of :meth:`get`."""

    def __init__(self, size: int):
        self.size = size
        self.hits = self.misses = 0
        self._edges: OrderedDict[tuple, tuple[str, int]] = OrderedDict()
        self._ids: dict[tuple, dict[tuple[str, ...], int]] = {}  # game -> fact set -> sid
        self._states: dict[tuple, list[EngineState]] = {}  # game -> sid -> state
        self._paths: dict[tuple, list[tuple[str, ...]]] = {}  # game -> sid -> shortest known path
        self._starts: dict[tuple, tuple[str, str, int]] = {}  # game -> (intro text, task, sid)

    def state(self, game: tuple, sid: int) -> EngineState:
        return self._states[game][sid]

    def path(self, game: tuple, sid: int) -> tuple[str, ...]:
        return self._paths[game][sid]

    def start(self, game: tuple) -> tuple[str, str, int] | None:
        return self._starts.get(game)

    def set_start(self, game: tuple, text: str, task: str, sid: int) -> None:
        self._starts[game] = (text, task, sid)

    def intern(self, game: tuple, fact_set: tuple[str, ...], make, path: tuple[str, ...]) -> int:
        """sid of a fact set (``make(sid)`` builds its EngineState the first time); keeps ``path``
        as the way there if it is the shortest seen."""
        ids = self._ids.setdefault(game, {})
        sid = ids.get(fact_set)
        if sid is None:
            sid = ids[fact_set] = len(ids)
            self._states.setdefault(game, []).append(make(sid))
            self._paths.setdefault(game, []).append(path)
        elif len(path) < len(self._paths[game][sid]):
            self._paths[game][sid] = path
        return sid

    def get(self, game: tuple, sid: int, command: str, count: bool = True) -> tuple[str, int] | None:
        hit = self._edges.get((game, sid, command))
        if count:
            self.hits += hit is not None
            self.misses += hit is None
            if hit is not None:
                self._edges.move_to_end((game, sid, command))
        return hit

    def put(self, game: tuple, sid: int, command: str, feedback: str, nxt: int) -> None:
        self._edges[(game, sid, command)] = (feedback, nxt)
        if len(self._edges) > self.size:
            self._edges.popitem(last=False)

    def route(self, game: tuple, src: int, dst: int, depth: int) -> list[str] | None:
        """Commands leading src -> dst through cached transitions (breadth-first, <= depth), or None."""
        frontier, seen = [(src, [])], {src}
        for _ in range(depth):
            nxt = []
            for sid, path in frontier:
                for cmd in self.state(game, sid).admissible:
                    edge = self.get(game, sid, cmd, count=False)
                    if edge is None or edge[1] in seen:
                        continue
                    if edge[1] == dst:
                        return path + [cmd]
                    seen.add(edge[1])
                    nxt.append((edge[1], path + [cmd]))
            frontier = nxt
        return None


_CACHES: dict[int, TransitionCache] = {}


def transition_cache(size: int) -> TransitionCache:
    """The process-wide cache of this size (the envs of a process share what they have seen)."""
    return _CACHES.setdefault(size, TransitionCache(size))


class GameEnv:
    """One ALFWorld game in this process; ``expert`` None / "handcoded" / "planner"; ``cache``: a
    TransitionCache (not used with the handcoded expert, whose plan depends on the episode so far)."""

    RESET_COST = 2  # an engine reset costs about two steps (bench/env_speed.py): used to choose a replay
    ROUTE_DEPTH = 2

    def __init__(self, expert: str | None = None, max_steps: int = 50, cache: TransitionCache | None = None):
        self.expert = expert
        self.max_steps = max_steps
        self.cache = cache if expert != "handcoded" else None
        self._env = None
        self._gamefile: str | None = None  # game of the loaded engine
        self._meta: str | None = None  # game of task_type / params
        self._at: int | None = None  # sid where the real engine is (cache on), None: not reset since load
        self._expert_rng = random.Random(0)  # the handcoded expert's tie-breaks in this game

    def _load_meta(self, gamefile: str) -> None:
        if self._meta == gamefile:
            return
        with open(gamefile) as f:
            self._rng_seed = zlib.crc32(json.load(f)["pddl_problem"].encode())
        with open(os.path.join(os.path.dirname(gamefile), "traj_data.json")) as f:
            traj = json.load(f)
        self.task_type = traj["task_type"]
        self.params = traj["pddl_params"]
        self._meta = gamefile

    def _load(self, gamefile: str) -> None:
        """Load ``gamefile`` into this env's engine, made on first use and then reused: every new
        textworld PddlEnv copies fast-downward's shared library to a temporary file."""
        if not _REUSE_ENGINES:
            self.close()
        argv = sys.argv[:]
        try:
            if self._env is None:
                infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
                wrappers = [AlfredDemangler(shuffle=False), AlfredInfos]
                if self.expert is not None:
                    wrappers.append(AlfredExpert(expert_type=self.expert))  # keyword: 1st arg is `env`
                self._env = textworld.start(gamefile, infos, wrappers)
            else:
                self._gamefile = None  # a failed load leaves no game behind
                self._env.load(gamefile)
        finally:
            sys.argv[:] = argv
        self._gamefile, self._at = gamefile, None

    def _engine_reset(self, gamefile: str):
        if self._env is None or gamefile != self._gamefile:
            self._load(gamefile)
        self._expert_rng.seed(self._rng_seed)
        _handcoded.random = self._expert_rng
        argv = sys.argv[:]
        try:
            return self._env.reset()
        finally:
            sys.argv[:] = argv

    def _engine_step(self, command: str):
        _handcoded.random = self._expert_rng
        argv = sys.argv[:]
        try:
            return self._env.step(command)[0]
        finally:
            sys.argv[:] = argv

    def reset(self, gamefile: str) -> Observation:
        self._load_meta(gamefile)
        self.game = (gamefile, self.expert)
        start = self.cache.start(self.game) if self.cache is not None else None
        if start is None:
            state = self._engine_reset(gamefile)
            text, self.task = split_intro(state.feedback)
            self._sid = self._view(state, ())
            if self.cache is not None:
                self.cache.set_start(self.game, text, self.task, self._sid)
                self._at = self._sid
        else:  # the engine is reset lazily, at the first miss
            text, self.task, self._sid = start
            if self._gamefile != gamefile:
                self._at = None
        self.steps, self.done, self.won = 0, False, False
        self._initial = self._state().facts
        self._reached = oracle.subgoals(self._initial, self.task_type, self.params)
        self.obs = self._observation(text)
        return self.obs

    def _view(self, state, path: tuple[str, ...]):
        """The EngineState of the engine's current state: its sid with the cache, else itself."""
        def make(sid):
            names = {k: info.name for k, info in state["_entity_infos"].items()}
            admissible = tuple(c for c in state["admissible_commands"] if c not in DROPPED_COMMANDS)
            plan = None
            if self.expert is not None:
                plan = tuple(c for c in (state.get("extra.expert_plan") or []) if c in admissible)
            return EngineState(sid, admissible, bool(state["won"]), oracle.parse_facts(state["_facts"], names), plan)

        if self.cache is None:
            self._current = make(-1)
            return -1
        return self.cache.intern(self.game, tuple(sorted(map(str, state["_facts"]))), make, path)

    def _state(self) -> EngineState:
        return self._current if self.cache is None else self.cache.state(self.game, self._sid)

    def _materialise(self) -> None:
        """Bring the real engine to the logical state: nothing, a route through cached transitions
        from where it is, or a reset and the shortest known path, whichever is cheapest."""
        if self._at == self._sid and self._gamefile == self.game[0] and self._env is not None:
            return
        route = None
        if self._at is not None and self._gamefile == self.game[0] and self._env is not None:
            route = self.cache.route(self.game, self._at, self._sid, self.ROUTE_DEPTH)
        path = self.cache.path(self.game, self._sid)
        if route is None or len(route) > len(path) + self.RESET_COST:
            self._engine_reset(self.game[0])
            self._at, route = self.cache.start(self.game)[2], list(path)
        for cmd in route:
            state = self._engine_step(cmd)
            self._at = self._view(state, self.cache.path(self.game, self._at) + (cmd,))
        if self._at != self._sid:
            raise EngineError(f"transition cache: replay reached state {self._at}, expected {self._sid}")

    def _observation(self, text: str) -> Observation:
        st = self._state()
        return Observation(text=text, task=self.task, admissible=st.admissible,
                           state_key=oracle.state_key(st.facts, self._initial),
                           oracle_actions=None if st.plan is None else st.plan[:1])

    def step(self, action: str) -> StepResult:
        invalid = action not in self.obs.admissible
        hit = False
        try:
            fault_point("env.step")  # test-only fault injection (envs/faults.py)
            if self.cache is None:
                state = self._engine_step(action)
                feedback = state.feedback.strip()
                self._view(state, ())
            else:
                edge = self.cache.get(self.game, self._sid, action)
                hit = edge is not None
                if hit:
                    feedback, self._sid = edge
                else:
                    self._materialise()
                    state = self._engine_step(action)
                    feedback = state.feedback.strip()
                    src = self._sid
                    self._sid = self._at = self._view(state, self.cache.path(self.game, src) + (action,))
                    self.cache.put(self.game, src, action, feedback, self._sid)
            self.steps += 1
            st = self._state()
            self.won = st.won
            now = oracle.subgoals(st.facts, self.task_type, self.params)
            order = oracle.SUBGOAL_ORDER[self.task_type]
            new = tuple(s for s in order if s in now and s not in self._reached)
            self._reached |= now
            self.done = self.won or self.steps >= self.max_steps
            self.obs = self._observation(feedback)
            return StepResult(observation=self.obs, reward=1.0 if self.won else 0.0, done=self.done,
                              won=self.won, score=1.0 if self.won else 0.0, invalid=invalid,
                              subgoals=new, info={"steps": self.steps, "cache_hit": hit})
        except Exception:  # engine fault: end the episode, rebuild the env at the next reset
            self.close()
            self.done = True
            return StepResult(observation=self.obs, reward=0.0, done=True, won=False, score=0.0,
                              invalid=invalid, error=traceback.format_exc(), info={"steps": self.steps})

    def close(self) -> None:
        if self._env is not None:
            try:
                self._env.close()
            except Exception:  # noqa: BLE001 - closing a broken env must not raise
                pass
        self._env, self._gamefile, self._at = None, None, None


def verify_game(gamefile: str, expert: str, max_steps: int) -> tuple[list[str] | None, str]:
    """Play the expert (then the other expert) to a win; (winning actions or None, expert used)."""
    for name in (expert, "planner" if expert == "handcoded" else "handcoded"):
        env = GameEnv(expert=name, max_steps=max_steps)
        try:
            obs = env.reset(gamefile)
            actions: list[str] = []
            while not env.done:
                if not obs.oracle_actions:
                    break
                actions.append(obs.oracle_actions[0])
                res = env.step(actions[-1])
                obs = res.observation
                if res.error:
                    break
            if env.won:
                return actions, name
        except Exception:  # noqa: BLE001 - an unloadable game is unsolvable
            pass
        finally:
            env.close()
    return None, expert


# ----------------------------------------------------------------------------- batches

def serve(envs: dict[int, GameEnv], cache, experts, max_steps, cmd: str, items) -> list:
    """One request of a worker (a process or a Ray actor): reset or step its slots' envs in order."""
    out = []
    for slot, arg in items:
        env = envs.setdefault(slot, GameEnv(experts[slot], max_steps, cache))
        try:
            out.append(env.reset(arg) if cmd == "reset" else env.step(arg))
        except Exception:  # noqa: BLE001 - reported to the parent
            env.close()
            out.append(EngineError(traceback.format_exc()))
    return out


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
