"""ALFWorld as an :class:`EnvSuite`: generated games (default) or the official data."""
from __future__ import annotations

import glob
import json
import math
import os
import random
import re
from typing import Callable, Iterable

from envs.alfworld import engine, generator
from envs.alfworld.config import OFFICIAL_SPLITS, ORACLE_MODES, SPLITS, AlfworldConfig
from envs.alfworld.splits import check_split, describe
from envs.base import EnvError, EnvSuite, Task, VectorEnv

import alfworld.gen.constants as C  # noqa: E402
from alfworld.info import ALFRED_TWL2_PATH, __version__ as ALFWORLD_VERSION  # noqa: E402
import textworld  # noqa: E402


def official_games(config: AlfworldConfig, split: str) -> list[str]:
    """Solvable game files of an official split folder (train / valid_seen / valid_unseen)."""
    name = OFFICIAL_SPLITS.get(split, split)
    root = os.path.join(config.official_path, name)
    if not os.path.isdir(root):
        raise EnvError(f"official data: no folder {root!r} for split {split!r}")
    out = []
    for traj_path in sorted(glob.glob(os.path.join(root, "**", "traj_data.json"), recursive=True)):
        folder = os.path.dirname(traj_path)
        game = os.path.join(folder, "game.tw-pddl")
        if "movable" in folder or "Sliced" in folder or not os.path.exists(game):
            continue
        with open(traj_path) as f:
            if json.load(f)["task_type"] not in config.task_types:
                continue
        with open(game) as f:
            if not json.load(f).get("solvable", False):
                continue
        out.append(game)
    return out


class AlfworldSuite(EnvSuite):
    name = "alfworld"
    # "look" changes nothing and shows nothing new (in the middle of the room it answers "you see
    # nothing"); the handcoded expert opens every walkthrough with it (its scripted first subgoal)
    # and issues it again when its plan stalls
    no_op_commands = frozenset({"look"})

    def __init__(self, config: AlfworldConfig | None = None, max_steps: int = 50):
        if max_steps < 1:
            raise EnvError("max_steps: must be >= 1")
        self.config = config or AlfworldConfig()
        self.max_steps = max_steps
        self._official: dict[str, list[str]] = {}  # official data: split -> its games in their fixed order

    @property
    def task_types(self) -> tuple[str, ...]:
        return self.config.task_types

    def tasks(self, split: str, n: int, seed: int = 0, *, start: int = 0,
              progress: Callable[[int, int], None] | None = None) -> list[Task]:
        """Games start..start+n-1 of the split (generated + verified + cached as needed), in an order
        fixed by ``seed``. Official data: a seeded sample of n of the split's games."""
        if split in OFFICIAL_SPLITS.values() and self.config.official_data is not None:
            split = {v: k for k, v in OFFICIAL_SPLITS.items()}[split]
        check_split(split)
        if n < 1 or start < 0:
            raise EnvError(f"n: must be >= 1 and start >= 0, got n={n}, start={start}")
        rng = random.Random(f"alfworld-tasks|{split}|{seed}")
        if self.config.official_data is not None:
            games = self._official_order(split)
            if n > len(games):
                raise EnvError(f"{split}: asked for {n} games, the official split has {len(games)}")
            if start + n > len(games):
                raise EnvError(f"{split}: asked for games {start}..{start + n - 1}, the official split has {len(games)}")
            games = games[start:start + n]
            rng.shuffle(games)
            root = self.config.official_path
            ids = [os.path.relpath(os.path.dirname(g), root) for g in games]
        else:
            games = generator.generate_games(self.config, split, n, progress, start=start)
            ids = list(range(start, start + n))
            order = list(range(n))
            rng.shuffle(order)
            games, ids = [games[i] for i in order], [ids[i] for i in order]
        tasks = []
        for game, ident in zip(games, ids):
            with open(os.path.join(os.path.dirname(game), "traj_data.json")) as f:
                traj = json.load(f)
            tt = traj["task_type"]
            tid = f"alfworld/{split}/{tt}/{ident:05d}" if isinstance(ident, int) else f"alfworld/{ident}"
            tasks.append(Task(task_id=tid, split=split, task_type=tt,
                              payload={"gamefile": os.path.abspath(game),
                                       "floor_plan": traj.get("scene", {}).get("floor_plan", ""),
                                       "pddl_params": traj["pddl_params"]}))
        return tasks

    def _official_order(self, split: str) -> list[str]:
        """The official split's games in their fixed order (the positions of ``tasks``), read once."""
        if split not in self._official:
            games = official_games(self.config, split)
            self._official[split] = random.Random(f"alfworld-official|{split}").sample(games, len(games))
        return list(self._official[split])

    def task_positions(self, split: str, task_types) -> list[int]:
        """Generated games: game i has the i-th type of the configured cycle (generator.task_type_of), so
        no game is built; official data: read from each game's traj_data.json."""
        unknown = sorted(set(task_types) - set(self.config.task_types))
        if unknown:
            raise EnvError(f"task types {unknown}: not in this suite's {list(self.config.task_types)}")
        if split in OFFICIAL_SPLITS.values() and self.config.official_data is not None:
            split = {v: k for k, v in OFFICIAL_SPLITS.items()}[split]
        check_split(split)
        if self.config.official_data is None:
            return [i for i in range(self.split_size(split)) if generator.task_type_of(self.config, i) in task_types]
        types = []
        for game in self._official_order(split):
            with open(os.path.join(os.path.dirname(game), "traj_data.json")) as f:
                types.append(json.load(f)["task_type"])
        return [i for i, t in enumerate(types) if t in task_types]

    def split_size(self, split: str) -> int:
        if self.config.official_data is not None:
            return len(self._official_order(check_split(split)))
        return self.config.pool_size(check_split(split))

    def make_vector_env(self, num_envs: int, *, oracle: bool | str = False) -> VectorEnv:
        """``oracle``: True / "all" (expert labels in every slot), "sample" (in the leading
        ``oracle_share`` of the slots, at least one: with groups laid out task by task, a fixed share
        of the groups), False / "off" (none)."""
        mode = {True: "all", False: "off"}.get(oracle, oracle)
        if mode not in ORACLE_MODES:
            raise EnvError(f"oracle: {oracle!r}; allowed {list(ORACLE_MODES)}")
        slots = {"all": num_envs, "off": 0, "sample": max(1, math.ceil(self.config.oracle_share * num_envs))}[mode]
        return engine.AlfworldVectorEnv(num_envs, expert=self.config.expert if slots else None,
                                        max_steps=self.max_steps, workers=self.config.workers,
                                        step_timeout_s=self.config.step_timeout_s, expert_slots=slots,
                                        cache_size=self.config.cache_size if self.config.cache else 0,
                                        backend=self.config.workers_backend, ray_resource=self.config.ray_resource,
                                        ray_cpus=self.config.ray_worker_cpus)

    def text_corpus(self) -> Iterable[str]:
        """Grammar sentences, goal templates and command forms over ALFWorld's object names."""
        with open(ALFRED_TWL2_PATH) as f:
            for rhs in re.findall(r'"rhs":\s*"((?:[^"\\]|\\.)*)"', f.read()):
                yield rhs
        recs = sorted(r.lower() for r in C.VAL_RECEPTACLE_OBJECTS)
        objs = sorted(o.lower() for o in generator.PICKUPABLE | set(generator.LAMPS))
        for i, o in enumerate(objs):
            r = recs[i % len(recs)]
            k = 1 + i % 5
            yield f"take {o} {k} from {r} {k}"
            yield f"move {o} {k} to {r} {k}"
            yield f"You pick up the {o} {k} from the {r} {k}."
        for r in recs:
            for verb in ("go to", "open", "close", "examine"):
                yield f"{verb} {r} 1"
            yield f"You arrive at {r} 1. On the {r} 1, you see a {objs[len(r) % len(objs)]} 1."
        for tt in self.config.task_types:
            for t in generator.glib.gdict[tt]["templates"]:
                yield "Your task is to: " + t.format(obj="apple", recep="countertop", toggle="desklamp",
                                                     mrecep="") + "."
        yield "You are in the middle of a room. Looking quickly around you, you see a cabinet 1."
        yield "Nothing happens."

    def describe_splits(self) -> dict:
        return {**describe(self.config), "splits": list(SPLITS), "max_steps": self.max_steps,
                "engine": {"alfworld": ALFWORLD_VERSION, "textworld": textworld.__version__,
                           "generator_version": generator.GENERATOR_VERSION},
                "cache": None if self.config.official_data else generator.cache_root(self.config)}
