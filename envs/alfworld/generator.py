"""Deterministic generator of ALFWorld games (``game.tw-pddl`` + ``traj_data.json``).

Game ``i`` of a split is a pure function of (generator version, config, split, i): a floor plan
of the split is drawn, its receptacles (``gen/layouts/FloorPlan*-openable.json``) and object
classes (``FloorPlan*-objects.json``) are read from the installed alfworld package, a moderate
scene is sampled (``min_receptacles..max_receptacles`` receptacles, up to ``max_objects``
objects, all openables closed), and the goal is ALFWorld's own PDDL goal and sentence template
(``gen/goal_library.py``) on ALFWorld's domain and grammar (``data/alfred.pddl|twl2``). Object
affordances and which receptacle may contain what come from ``gen/constants.py``. Every game is
played to a win by the expert before it is written; a candidate that fails is redrawn.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import asdict
from typing import Callable

from envs.alfworld import game_env  # sets ALFWORLD_DATA before alfworld is imported
from envs.alfworld.config import AlfworldConfig
from envs.alfworld.splits import check_split, combo_allowed, floorplans, room_type
from envs.base import EnvError

import alfworld.gen  # noqa: E402
import alfworld.gen.constants as C  # noqa: E402
import alfworld.gen.goal_library as glib  # noqa: E402
from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH  # noqa: E402

GENERATOR_VERSION = 1
LAYOUTS = os.path.join(os.path.dirname(alfworld.gen.__file__), "layouts")
MAX_ATTEMPTS = 40

BASINS = {"Sink": "SinkBasin", "Bathtub": "BathtubBasin"}  # layout class -> receptacle class
MOVABLE = set(C.MOVABLE_RECEPTACLES)
STATIC_RECEPTACLES = set(C.VAL_RECEPTACLE_OBJECTS) - MOVABLE
PICKUPABLE = {o for objs in C.VAL_RECEPTACLE_OBJECTS.values() for o in objs
              if not o.endswith("Sliced")} - STATIC_RECEPTACLES - {"Box"}
LAMPS = ("DeskLamp", "FloorLamp")
TOOL = {"pick_clean_then_place_in_recep": ("SinkBasin", "Cleanable"),
        "pick_heat_then_place_in_recep": ("Microwave", "Heatable"),
        "pick_cool_then_place_in_recep": ("Fridge", "Coolable")}


class GenerationError(EnvError):
    """No solvable game could be generated for a (split, index)."""


# ----------------------------------------------------------------------------- scene reading

def read_floorplan(floorplan: int) -> tuple[dict[str, int], list[str], list[str]]:
    """(receptacle class -> instance count, pickupable classes, lamp classes) of a floor plan."""
    name = f"FloorPlan{floorplan}"
    try:
        with open(os.path.join(LAYOUTS, f"{name}-openable.json")) as f:
            recs = json.load(f)
        with open(os.path.join(LAYOUTS, f"{name}-objects.json")) as f:
            objs = json.load(f)
    except FileNotFoundError as e:
        raise EnvError(f"floor plan {floorplan}: no layout in the alfworld package ({e.filename})") from e
    counts: dict[str, int] = {}
    for key in sorted(recs):
        cls = key.split("|")[0]
        cls = BASINS.get(cls, cls)
        if cls in STATIC_RECEPTACLES:
            counts[cls] = counts.get(cls, 0) + 1
    for cls in sorted(objs):  # receptacles without an interaction pose (stove burner, toaster...)
        cls = BASINS.get(cls, cls)
        if cls in STATIC_RECEPTACLES and cls not in counts:
            counts[cls] = 1
    pick = sorted(set(objs) & PICKUPABLE)
    lamps = [lamp for lamp in LAMPS if lamp in objs]
    return counts, pick, lamps


def can_contain(recep: str, obj: str) -> bool:
    return obj in C.VAL_RECEPTACLE_OBJECTS.get(recep, ())


def has_affordance(obj: str, affordance: str) -> bool:
    return obj in C.VAL_ACTION_OBJECTS[affordance]


# ----------------------------------------------------------------------------- task choice

def task_candidates(config: AlfworldConfig, split: str, task_type: str, floorplan: int):
    """All (obj, recep, toggle) goals of a task type that the floor plan supports."""
    if room_type(floorplan) not in C.GOALS_VALID[task_type]:
        return []
    counts, pick, lamps = read_floorplan(floorplan)
    out = []
    if task_type == "look_at_obj_in_light":
        hosts = [r for r in counts if r not in C.OPENABLE_CLASS_SET]
        for lamp in (lamps if hosts else []):
            for obj in pick:
                if any(can_contain(r, obj) for r in counts) and combo_allowed(config, split, task_type, obj, lamp):
                    out.append((obj, "", lamp))
        return out
    tool, affordance = TOOL.get(task_type, (None, None))
    if tool is not None and tool not in counts:
        return []
    for obj in pick:
        if affordance and not has_affordance(obj, affordance):
            continue
        for recep in counts:
            if recep == tool or not can_contain(recep, obj):
                continue
            # the object must start somewhere other than the goal receptacle
            if not any(can_contain(r, obj) for r in counts if r != recep):
                continue
            if combo_allowed(config, split, task_type, obj, recep):
                out.append((obj, recep, ""))
    return out


# ----------------------------------------------------------------------------- scene sampling

def _ident(cls: str, k: int) -> str:
    if cls in BASINS.values():
        base = cls[: -len("Basin")]
        return f"{base}_bar_{k:02d}_bar_{cls}"
    return f"{cls}_bar_{k:02d}"


def sample_scene(config: AlfworldConfig, rng: random.Random, floorplan: int, task_type: str,
                 obj: str, recep: str, toggle: str) -> dict:
    """Receptacle instances, object placements and lamp of one scene (plain data)."""
    counts, pick, _ = read_floorplan(floorplan)
    instances = [(cls, k) for cls in sorted(counts) for k in range(1, counts[cls] + 1)]
    required: list[tuple[str, int]] = []
    need = [c for c in (recep, TOOL.get(task_type, ("",))[0]) if c]
    for cls in need:
        required.append((cls, rng.randint(1, counts[cls])))
    starts = sorted(r for r in counts if r != recep and can_contain(r, obj))  # where the object starts
    start = rng.choice(starts)
    required.append((start, rng.randint(1, counts[start])))
    if toggle:
        hosts = sorted(r for r in counts if r not in C.OPENABLE_CLASS_SET)
        h = rng.choice(hosts)
        required.append((h, rng.randint(1, counts[h])))
    required = sorted(set(required))
    size = rng.randint(config.min_receptacles, config.max_receptacles)
    rest = [i for i in instances if i not in required]
    rng.shuffle(rest)
    chosen = sorted(set(required) | set(rest[: max(0, size - len(required))]))
    classes = sorted({c for c, _ in chosen})

    n_targets = rng.randint(2, 3) if task_type == "pick_two_obj_and_place" else rng.randint(1, 2)
    distractor_classes = [o for o in pick if o != obj and any(can_contain(r, o) for r in classes)]
    n_distr = rng.randint(min(2, config.max_objects - n_targets), config.max_objects - n_targets)
    objects = [obj] * n_targets
    if distractor_classes:
        objects += [rng.choice(distractor_classes) for _ in range(n_distr)]
    placed: list[tuple[str, tuple[str, int]]] = []
    for o in objects:
        spots = [r for r in chosen if can_contain(r[0], o) and not (o == obj and r[0] == recep)]
        placed.append((o, rng.choice(spots)))
    lamp_at = None
    if toggle:
        spots = [r for r in chosen if r[0] not in C.OPENABLE_CLASS_SET]
        lamp_at = rng.choice(spots)
    return {"receptacles": chosen, "objects": placed, "lamp": (toggle, lamp_at) if toggle else None}


# ----------------------------------------------------------------------------- PDDL writing

def _goal_pddl(task_type: str, obj: str, recep: str, toggle: str) -> str:
    return glib.gdict[task_type]["pddl"].format(obj=obj, recep=recep, toggle=toggle).replace("#", "-")


def problem_pddl(name: str, scene: dict, task_type: str, obj: str, recep: str, toggle: str) -> str:
    """ALFRED-style PDDL problem: one location per receptacle, the agent in the middle of the room."""
    recs = scene["receptacles"]
    rid = {r: _ident(*r) for r in recs}
    rloc = {r: f"loc_bar_{i + 1:02d}" for i, r in enumerate(recs)}
    objs: list[tuple[str, str, tuple[str, int]]] = []  # (id, class, receptacle)
    seen: dict[str, int] = {}
    for cls, where in scene["objects"]:
        seen[cls] = seen.get(cls, 0) + 1
        objs.append((_ident(cls, seen[cls]), cls, tuple(where)))
    if scene["lamp"]:
        lamp, where = scene["lamp"]
        objs.append((_ident(lamp, 1), lamp, tuple(where)))
    otypes = sorted({c for _, c, _ in objs})
    rtypes = sorted({c for c, _ in recs})
    init = ["(atLocation agent1 loc_bar_start)"]
    for r in recs:
        init += [f"(receptacleType {rid[r]} {r[0]}Type)", f"(receptacleAtLocation {rid[r]} {rloc[r]})"]
        if r[0] in C.OPENABLE_CLASS_SET:
            init.append(f"(openable {rid[r]})")
    for oid, cls, where in objs:
        init += [f"(objectType {oid} {cls}Type)", f"(inReceptacle {oid} {rid[where]})",
                 f"(objectAtLocation {oid} {rloc[where]})"]
        if cls in LAMPS:
            init.append(f"(toggleable {oid})")
            continue
        init.append(f"(pickupable {oid})")
        for aff, pred in (("Heatable", "heatable"), ("Coolable", "coolable"), ("Cleanable", "cleanable"),
                          ("Sliceable", "sliceable")):
            if has_affordance(cls, aff):
                init.append(f"({pred} {oid})")
        if cls in MOVABLE:
            init.append(f"(isReceptacleObject {oid})")
    for rt in rtypes:
        for ot in otypes:
            if can_contain(rt, ot):
                init.append(f"(canContain {rt}Type {ot}Type)")
    locs = ["loc_bar_start"] + [rloc[r] for r in recs]
    return "\n".join([
        f"(define (problem {name})", "(:domain alfred)", "(:objects", "    agent1 - agent",
        f"    {' '.join(t + 'Type' for t in otypes)} - otype",
        f"    {' '.join(t + 'Type' for t in rtypes)} - rtype",
        f"    {' '.join(o for o, _, _ in objs)} - object",
        f"    {' '.join(rid[r] for r in recs)} - receptacle",
        f"    {' '.join(locs)} - location", ")", "(:init",
        *("    " + fact for fact in init), ")",
        _goal_pddl(task_type, obj, recep, toggle).strip(), "",  # ALFWorld's goal text closes (define
    ])


def task_sentence(rng: random.Random, task_type: str, obj: str, recep: str, toggle: str) -> str:
    template = rng.choice(glib.gdict[task_type]["templates"])
    return template.format(obj=obj.lower(), recep=recep.lower(), toggle=toggle.lower(), mrecep="")


# ----------------------------------------------------------------------------- games on disk

def cache_root(config: AlfworldConfig) -> str:
    """Folder of this configuration's games (a fingerprint of everything that shapes a game)."""
    keys = ("seed", "task_types", "train_floorplans", "ood_floorplans", "ood_combo_fraction",
            "min_receptacles", "max_receptacles", "max_objects", "expert", "verify_steps")
    d = asdict(config)
    blob = json.dumps({"v": GENERATOR_VERSION, **{k: d[k] for k in keys}}, sort_keys=True)
    return os.path.join(config.data_dir, "gen-" + hashlib.sha1(blob.encode()).hexdigest()[:12])


def game_dir(config: AlfworldConfig, split: str, index: int) -> str:
    return os.path.join(cache_root(config), split, f"{index:05d}")


def _rng(config: AlfworldConfig, split: str, index: int, attempt: int) -> random.Random:
    digest = hashlib.sha256(f"alfworld|v{GENERATOR_VERSION}|{config.seed}|{split}|{index}|{attempt}".encode())
    return random.Random(int.from_bytes(digest.digest()[:8], "big"))


def task_type_of(config: AlfworldConfig, index: int) -> str:
    """The task type of game ``index`` of every split: the configured types in turn."""
    return config.task_types[index % len(config.task_types)]


def build_game(config: AlfworldConfig, split: str, index: int, attempt: int) -> tuple[dict, dict] | None:
    """(game.tw-pddl data, traj_data) of one candidate, or None when the draw has no valid goal."""
    rng = _rng(config, split, index, attempt)
    task_type = task_type_of(config, index)
    plans = [fp for fp in floorplans(config, split) if room_type(fp) in C.GOALS_VALID[task_type]]
    if not plans:
        raise GenerationError(f"{split}: no floor plan of a room type valid for {task_type}")
    floorplan = rng.choice(plans)
    goals = task_candidates(config, split, task_type, floorplan)
    if not goals:
        return None
    obj, recep, toggle = rng.choice(goals)
    scene = sample_scene(config, rng, floorplan, task_type, obj, recep, toggle)
    sentence = task_sentence(rng, task_type, obj, recep, toggle)
    with open(ALFRED_PDDL_PATH) as f:
        domain = f.read()
    with open(ALFRED_TWL2_PATH) as f:
        grammar = f.read().replace("UNKNOWN GOAL", sentence)
    name = f"milegpo_{split}_{index:05d}"
    game = {"grammar": grammar, "pddl_domain": domain,
            "pddl_problem": problem_pddl(name, scene, task_type, obj, recep, toggle), "solvable": False}
    traj = {"task_type": task_type,
            "pddl_params": {"object_target": obj, "parent_target": recep, "toggle_target": toggle,
                            "mrecep_target": "", "object_sliced": False},
            "scene": {"floor_plan": f"FloorPlan{floorplan}", "scene_num": floorplan,
                      "room_type": room_type(floorplan), "num_receptacles": len(scene["receptacles"]),
                      "num_objects": len(scene["objects"])},
            "task_desc": sentence,
            "milegpo": {"generator_version": GENERATOR_VERSION, "seed": config.seed, "split": split,
                        "index": index, "attempt": attempt}}
    return game, traj


def _write(folder: str, game: dict, traj: dict) -> str:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "game.tw-pddl"), "w") as f:
        json.dump(game, f, sort_keys=True)
    with open(os.path.join(folder, "traj_data.json"), "w") as f:
        json.dump(traj, f, sort_keys=True, indent=1)
    return os.path.join(folder, "game.tw-pddl")


def generate_game(config: AlfworldConfig, split: str, index: int) -> str:
    """Path of game ``index`` of ``split``, generating and verifying it if not cached."""
    check_split(split)
    final = game_dir(config, split, index)
    path = os.path.join(final, "game.tw-pddl")
    if os.path.exists(path):
        return path
    os.makedirs(os.path.dirname(final), exist_ok=True)
    errors = []  # engine errors of attempts that could not be played at all
    for attempt in range(MAX_ATTEMPTS):
        built = build_game(config, split, index, attempt)
        if built is None:
            continue
        game, traj = built
        tmp = tempfile.mkdtemp(prefix=f".{index:05d}-", dir=os.path.dirname(final))
        try:
            walkthrough, expert, error = game_env.verify_game(_write(tmp, game, traj), config.expert,
                                                              config.verify_steps)
            if walkthrough is None:
                errors += [error] if error else []
                continue
            game["solvable"], game["walkthrough"] = True, walkthrough
            traj["milegpo"]["expert"] = expert
            _write(tmp, game, traj)
            try:
                os.rename(tmp, final)
            except OSError:  # another process wrote the same game first (identical content)
                pass
            return path
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    why = f" ({len(errors)} could not be played; the last: {errors[-1]})" if errors else ""
    raise GenerationError(f"{split}/{index}: no expert-solvable game in {MAX_ATTEMPTS} attempts{why}")


def generate_games(config: AlfworldConfig, split: str, n: int,
                   progress: Callable[[int, int], None] | None = None, start: int = 0) -> list[str]:
    """Paths of games start..start+n-1 of a split (generated and cached as needed); progress(done, n)."""
    check_split(split)
    if config.official_data is not None:
        raise EnvError("official_data is set: the official games are played, nothing to generate")
    if start + n > config.pool_size(split):
        raise EnvError(f"{split}: n={n} from game {start} exceeds the split's pool of {config.pool_size(split)} games")
    paths = []
    for i in range(n):
        paths.append(generate_game(config, split, start + i))
        if progress is not None:
            progress(i + 1, n)
    return paths
