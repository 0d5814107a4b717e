"""Configuration of the ALFWorld environment (the recipe's ``[env.alfworld]`` section)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from envs.base import EnvError

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
SPLITS = ("train", "id", "ood")
OFFICIAL_SPLITS = {"train": "train", "id": "valid_seen", "ood": "valid_unseen"}
EXPERTS = ("handcoded", "planner")
WORKER_BACKENDS = ("process", "ray")
ORACLE_MODES = ("all", "sample", "off")  # which slots of a vector env made with oracle labels run the expert

# ALFWorld's own scene split (alfworld/gen/constants.py TRAIN_/TEST_SCENE_NUMBERS): floor plans
# 7-30 of each room type are training rooms, 1-6 are held out (valid_unseen / OOD).
_ROOM_BASES = (0, 200, 300, 400)  # kitchen, living room, bedroom, bathroom
TRAIN_FLOORPLANS = tuple(b + i for b in _ROOM_BASES for i in range(7, 31))
OOD_FLOORPLANS = tuple(b + i for b in _ROOM_BASES for i in range(1, 7))


@dataclass(frozen=True)
class AlfworldConfig:
    """Generated-game ALFWorld (or the official data when ``official_data`` is set).

    Splits: ``train`` and ``id`` games are built on ``train_floorplans`` from disjoint seed
    streams (like valid_seen); ``ood`` games on ``ood_floorplans`` (like valid_unseen). A fraction
    ``ood_combo_fraction`` of (task type, object, receptacle) combinations is reserved for ``ood``
    and never appears in train / id games.
    """

    data_dir: str = "runs/alfworld"  # cache of generated games
    seed: int = 0  # generator seed (game i of a split is a pure function of seed, split, i)
    task_types: tuple[str, ...] = TASK_TYPES
    train_floorplans: tuple[int, ...] = TRAIN_FLOORPLANS
    ood_floorplans: tuple[int, ...] = OOD_FLOORPLANS
    ood_combo_fraction: float = 0.2
    train_games: int = 2000  # pool size of each split: tasks(split, n, start=s) needs s + n <= pool
    id_games: int = 120
    ood_games: int = 120
    min_receptacles: int = 6  # scene size (receptacles, not counting the start location)
    max_receptacles: int = 12
    max_objects: int = 10  # pickupable objects in a scene, task objects included
    expert: str = "planner"  # oracle / verification expert: "planner" (shortest plan) | "handcoded"
    verify_steps: int = 50  # the expert must win within this many steps for a game to be kept
    workers: int = -1  # engine processes of a vector env: -1 = min(num_envs, cpu count), 0 = in-process
    workers_backend: str = "process"  # "process": local processes; "ray": Ray actors (envs/alfworld/ray_workers.py)
    ray_resource: str = ""  # "ray" backend: custom resource of the nodes the actors go to (e.g. "env_host"); "" = any node
    ray_worker_cpus: float = 1.0  # "ray" backend: CPUs each actor asks
    step_timeout_s: float = 30.0  # per-step engine timeout (worker processes only); 0 = none
    cache: bool = True  # exact transition cache (engine.TransitionCache): same episodes, fewer engine steps
    cache_size: int = 200_000  # transitions kept per process (least recently used evicted; ~1 KB each)
    oracle_share: float = 0.25  # oracle = "sample": share of a vector env's slots (leading ones) with the expert
    official_data: str | None = None  # folder with train/ valid_seen/ valid_unseen/ (json_2.1.1)

    def __post_init__(self) -> None:
        bad = sorted(set(self.task_types) - set(TASK_TYPES))
        if bad or not self.task_types:
            raise EnvError(f"task_types: unknown {bad or 'empty'}; allowed {list(TASK_TYPES)}")
        if self.workers_backend not in WORKER_BACKENDS:
            raise EnvError(f"workers_backend: {self.workers_backend!r}; allowed {list(WORKER_BACKENDS)}")
        if self.ray_worker_cpus < 0:
            raise EnvError("ray_worker_cpus: must be >= 0")
        if self.expert not in EXPERTS:
            raise EnvError(f"expert: {self.expert!r}; allowed {list(EXPERTS)}")
        shared = sorted(set(self.train_floorplans) & set(self.ood_floorplans))
        if shared:
            raise EnvError(f"train_floorplans and ood_floorplans share floor plans {shared}")
        if not self.train_floorplans or not self.ood_floorplans:
            raise EnvError("train_floorplans / ood_floorplans: must not be empty")
        if not 0.0 <= self.ood_combo_fraction < 1.0:
            raise EnvError("ood_combo_fraction: must be in [0, 1)")
        if not 3 <= self.min_receptacles <= self.max_receptacles:
            raise EnvError("min_receptacles/max_receptacles: need 3 <= min <= max")
        if self.max_objects < 3:
            raise EnvError("max_objects: must be >= 3")
        for name in ("train_games", "id_games", "ood_games", "verify_steps"):
            if getattr(self, name) < 1:
                raise EnvError(f"{name}: must be >= 1")
        if self.cache_size < 1:
            raise EnvError("cache_size: must be >= 1")
        if not 0.0 < self.oracle_share <= 1.0:
            raise EnvError("oracle_share: must be in (0, 1]")
        if self.step_timeout_s < 0:
            raise EnvError("step_timeout_s: must be >= 0")
        if self.official_data is not None and not os.path.isdir(self.official_path):
            raise EnvError(f"official_data: {self.official_data!r} is not a folder")

    @property
    def official_path(self) -> str:
        return os.path.expanduser(os.path.expandvars(self.official_data or ""))

    def pool_size(self, split: str) -> int:
        return {"train": self.train_games, "id": self.id_games, "ood": self.ood_games}[split]
