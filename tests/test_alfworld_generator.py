"""Generated ALFWorld games: all six task types won by the expert, determinism, splits, errors."""
import dataclasses
import json
import os

import pytest

os.environ.setdefault("ALFWORLD_DATA", os.path.abspath("runs/alfworld_data"))

from envs.alfworld import TASK_TYPES, AlfworldConfig  # noqa: E402
from envs.alfworld import generator  # noqa: E402
from envs.alfworld.game_env import GameEnv  # noqa: E402
from envs.alfworld.splits import combo_is_ood_only  # noqa: E402
from envs.alfworld.suite import AlfworldSuite  # noqa: E402
from envs.base import EnvError  # noqa: E402

from conftest import SMALL_ALFWORLD as SMALL  # noqa: E402


@pytest.fixture(scope="module")
def train_games(alfworld_config):
    return generator.generate_games(alfworld_config, "train", 6)


def test_each_task_type_generated_and_won_by_expert(alfworld_config, train_games):
    seen = set()
    for path in train_games:
        with open(os.path.join(os.path.dirname(path), "traj_data.json")) as f:
            traj = json.load(f)
        with open(path) as f:
            game = json.load(f)
        seen.add(traj["task_type"])
        assert game["solvable"] and game["walkthrough"]
        assert traj["scene"]["num_receptacles"] <= SMALL["max_receptacles"]
        env = GameEnv(expert=None, max_steps=50)  # replay the stored expert walkthrough
        obs = env.reset(path)
        assert obs.task.startswith("Your task is to: ") and "help" not in obs.admissible
        for action in game["walkthrough"]:
            assert action in obs.admissible
            res = env.step(action)
            obs = res.observation
        assert res.won and res.done and res.reward == 1.0
        env.close()
    assert seen == set(TASK_TYPES)


def test_same_seed_gives_byte_identical_games(alfworld_config, train_games, tmp_path):
    other = AlfworldConfig(data_dir=str(tmp_path), **SMALL)
    for i in (0, 3):
        again = generator.generate_game(other, "train", i)
        for name in ("game.tw-pddl", "traj_data.json"):
            a = open(os.path.join(os.path.dirname(train_games[i]), name), "rb").read()
            b = open(os.path.join(os.path.dirname(again), name), "rb").read()
            assert a == b
    reseeded = AlfworldConfig(data_dir=str(tmp_path / "s1"), seed=1, **SMALL)
    assert generator.build_game(reseeded, "train", 0, 0) != generator.build_game(alfworld_config, "train", 0, 0)


def test_splits_are_disjoint_in_floor_plans_and_reserved_combos(alfworld_config, train_games):
    ood = generator.generate_games(alfworld_config, "ood", 3)
    idg = generator.generate_games(alfworld_config, "id", 2)

    def meta(path):
        with open(os.path.join(os.path.dirname(path), "traj_data.json")) as f:
            t = json.load(f)
        p = t["pddl_params"]
        return t["scene"]["scene_num"], (t["task_type"], p["object_target"], p["parent_target"] or p["toggle_target"])

    train_plans = {meta(p)[0] for p in train_games + idg}
    ood_plans = {meta(p)[0] for p in ood}
    assert train_plans <= set(alfworld_config.train_floorplans) and ood_plans <= set(alfworld_config.ood_floorplans)
    assert not train_plans & ood_plans
    assert not any(combo_is_ood_only(alfworld_config, *meta(p)[1]) for p in train_games + idg)
    # the id games are other games than the train games
    assert {open(p).read() for p in idg}.isdisjoint({open(p).read() for p in train_games})
    with pytest.raises(EnvError, match="share floor plans"):
        AlfworldConfig(train_floorplans=(1, 7), ood_floorplans=(1, 2))


def test_bad_inputs_raise_clear_errors(alfworld_config):
    with pytest.raises(EnvError, match="task_types: unknown"):
        AlfworldConfig(task_types=("pick_and_fly",))
    with pytest.raises(EnvError, match="unknown split 'valid'"):
        AlfworldSuite(alfworld_config).tasks("valid", 2)
    with pytest.raises(EnvError, match="exceeds the split's pool"):
        generator.generate_games(alfworld_config, "ood", alfworld_config.ood_games + 1)
    with pytest.raises(EnvError, match="expert"):
        AlfworldConfig(expert="oracle")


def test_a_game_the_engine_cannot_play_names_the_engines_error(alfworld_config, tmp_path, monkeypatch):
    """A game no attempt could even load says why, instead of "no expert-solvable game" alone."""
    from envs import faults

    monkeypatch.setenv(faults.ENV_VAR, "env.reset:1+:raise")
    faults._hits.clear()
    fresh = dataclasses.replace(alfworld_config, data_dir=str(tmp_path))
    with pytest.raises(EnvError, match=r"train/0: no expert-solvable game in \d+ attempts \(\d+ could not be "
                                       r"played; the last: InjectedFault: injected fault at env.reset"):
        generator.generate_game(fresh, "train", 0)
    faults._hits.clear()


def test_tasks_fixed_list_and_describe(alfworld_config, train_games):
    suite = AlfworldSuite(alfworld_config)
    calls = []
    a = suite.tasks("train", 6, seed=3, progress=lambda i, n: calls.append((i, n)))
    assert a == suite.tasks("train", 6, seed=3) and calls[-1] == (6, 6)
    assert sorted(t.task_id for t in a) == sorted(t.task_id for t in suite.tasks("train", 6, seed=4))
    assert {t.task_type for t in a} == set(TASK_TYPES)
    d = suite.describe_splits()
    json.dumps(d)
    assert d["ood"]["floorplans"] == list(alfworld_config.ood_floorplans)
    assert any("move" in s for s in suite.text_corpus())


def test_default_floor_plan_split_is_alfworlds():
    import alfworld.gen.constants as C
    cfg = AlfworldConfig()
    assert set(cfg.train_floorplans) == set(C.TRAIN_SCENE_NUMBERS)
    assert set(cfg.ood_floorplans) == set(C.TEST_SCENE_NUMBERS)
