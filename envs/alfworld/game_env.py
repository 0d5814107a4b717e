"""One ALFWorld game at a time (textworld PddlEnv + ALFWorld's wrappers): :class:`GameEnv` reloads only
when the game changes (a group's N rollouts of one task reset without reloading); :func:`serve` runs
one request of a worker (envs/alfworld/engine.py's processes, ray_workers.py's actors).

An exact transition cache (:class:`TransitionCache`, ``env.alfworld.cache``): (game, expert, full
engine state, command) -> (feedback text, next state), where the full engine state is the set of
PDDL facts (the engine's outputs -- text, admissible commands, win, planner plan -- are functions of it
and the command). A hit does not advance the real engine: the env keeps a logical state, and on a
miss first brings the engine there by the cheapest known path (:meth:`GameEnv._materialise`). The
handcoded expert keeps a memory of the episode, so envs that run it bypass the cache.
"""
from __future__ import annotations

import json
import os
import random
import sys
import traceback
import zlib
from collections import OrderedDict
from dataclasses import dataclass

from envs.alfworld import engine_caches  # noqa: F401 - before alfworld: ALFWORLD_DATA, the memo tables

import textworld  # noqa: E402
from alfworld.agents.environment.alfred_tw_env import (  # noqa: E402
    AlfredDemangler, AlfredExpert, AlfredInfos)
import alfworld.agents.expert.handcoded_expert as _handcoded  # noqa: E402

from envs.alfworld import oracle  # noqa: E402
from envs.base import Observation, StepResult  # noqa: E402
from envs.faults import fault_point  # noqa: E402

# PYTHONHASHSEED of the engine worker processes and Ray actors (engine.py, ray_workers.py). The expert's
# walkthroughs depend on the hash seed of the process that steps the engine (an order of iteration that
# follows string hashes): under random seeds the comparison recipe's base won 362 or 363 of its 400
# walkthroughs from one build to the next, and started seed 0 at 13.1 % or 10.1 % id. 1 gives the
# walkthroughs (363 won, 5,468 steps) of the bases the published figures used.
ENGINE_HASH_SEED = "1"
BANNER = "-= Welcome to TextWorld, ALFRED! =-"
TASK_PREFIX = "Your task is to: "
DROPPED_COMMANDS = ("help",)  # verl-agent drops `help` from ALFWorld's admissible commands


class EngineError(RuntimeError):
    """The engine failed while loading / resetting a game (traceback in the message)."""


# The handcoded expert breaks ties with its module's `random`. Each game has its own generator,
# seeded from the game at every reset and installed before each of its engine calls, so that a
# walkthrough does not depend on the games stepped beside it in the same process (slots, workers).
_handcoded.random = random.Random(0)


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
        if not engine_caches.reuse_engines():
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
        fault_point("env.reset")  # test-only fault injection (envs/faults.py)
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


def verify_game(gamefile: str, expert: str, max_steps: int) -> tuple[list[str] | None, str, str]:
    """Play the expert (then the other expert) to a win; (winning actions or None, expert used, the
    engine's error when the game could not be played: "" when it was)."""
    error = ""
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
                return actions, name, ""
        except Exception as err:  # noqa: BLE001 - an unloadable game is unsolvable; the caller says why
            error = f"{type(err).__name__}: {err}"
        finally:
            env.close()
    return None, expert, error


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
