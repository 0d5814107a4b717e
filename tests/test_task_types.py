"""run.task_types (issue 41, the rare-success regime): PPO pools, evaluation lists and probe of the
chosen task types only, with the base policy unchanged (real ALFWorld engine, real WebShop simulator)."""
from __future__ import annotations

import json
import os
import shutil

import pytest
from typer.testing import CliRunner

from envs.alfworld import AlfworldConfig
from envs.alfworld.suite import AlfworldSuite
from milegpo_cli.cli import app
from milegpo_cli.config import load_config
from milegpo_cli.errors import ConfigError
from milegpo_cli.store import RunStore
from milegpo_cli.trainer import builders, loop
from milegpo_cli.trainer.base_policy import base_version
from milegpo_cli.trainer.evaluation import EVAL_ENVS, Probe, eval_tasks
from milegpo_cli.trainer.task_pools import base_tasks, ppo_pool, ranges, warmstart_tasks
from test_trainer import make_config, models_dir, quiet  # noqa: F401 - models_dir: the fixture

RARE = ("look_at_obj_in_light", "pick_two_obj_and_place")
RARE_SET = f"run.task_types={json.dumps(list(RARE))}"


def position(task) -> int:
    """A generated ALFWorld game's index in its split (the last part of its id)."""
    return int(task.task_id.rsplit("/", 1)[1])


def test_alfworld_pools_and_evaluation_lists_hold_only_the_chosen_types(tmp_path, models_dir):
    pytest.importorskip("alfworld")
    games = tmp_path / "games"  # a cache of its own: which games were built is part of the test
    config = make_config("alfworld", tmp_path, models_dir, RARE_SET, "env.alfworld.train_games=48",
                         "rollout.train_tasks=4", "eval.episodes=4", f"env.alfworld.data_dir={json.dumps(str(games))}")
    suite = builders.build_suite(config)
    lo, hi = ranges(48)["ppo"]
    pools = [ppo_pool(suite, 4, seed, RARE) for seed in (0, 1)]
    for pool in pools:
        assert len(pool) == 4 and {t.task_type for t in pool} <= set(RARE)
        assert all(lo <= position(t) < hi for t in pool)  # the PPO range: not the warm start's or the base's
    assert not {t.task_id for t in pools[0]} & {t.task_id for t in pools[1]}
    assert ppo_pool(suite, 4, 0, RARE) == pools[0]  # a pure function of the seed
    evals = eval_tasks(suite, "id", 4, RARE)
    assert [t.task_type for t in evals] == [RARE[0], RARE[1]] * 2  # the types alternate
    assert eval_tasks(suite, "id", 4, RARE) == evals  # fixed: the same for every run and seed
    # no game of another type was generated
    built = {int(name) for split in ("train", "id") for gen in games.iterdir() for name in os.listdir(gen / split)}
    assert built == {position(t) for t in [*pools[0], *pools[1], *evals]}


def test_official_alfworld_games_are_chosen_by_their_recorded_type(alfworld_config, tmp_path):
    pytest.importorskip("alfworld")
    root = tmp_path / "json_2.1.1"
    for t in AlfworldSuite(alfworld_config).tasks("id", 6):  # one game of each type, in the official layout
        trial = root / "valid_seen" / f"{t.task_type}-{t.payload['pddl_params']['object_target']}" / "trial_T0"
        trial.mkdir(parents=True)
        for name in ("game.tw-pddl", "traj_data.json"):
            shutil.copy(os.path.join(os.path.dirname(t.payload["gamefile"]), name), trial / name)
    official = AlfworldSuite(AlfworldConfig(official_data=str(root)))
    (chosen,) = eval_tasks(official, "id", 1, RARE[1:])
    assert chosen.task_type == RARE[1] and chosen.task_id.startswith(f"alfworld/valid_seen/{RARE[1]}-")
    assert len(official.task_positions("id", RARE)) == 2


def test_webshop_categories_filter_pools_evaluation_and_probe(tmp_path, models_dir):
    types = ("beauty", "garden")  # garden is an OOD category: the ood list holds only it
    config = make_config("webshop", tmp_path, models_dir, f"run.task_types={json.dumps(list(types))}",
                         "env.webshop.eval_instructions=40", "env.webshop.train_instructions=400", "eval.episodes=6")
    suite = builders.build_suite(config)
    pools = [ppo_pool(suite, 8, seed, types) for seed in (0, 1)]
    assert all(len(p) == 8 and {t.task_type for t in p} == {"beauty"} for p in pools)
    assert not {t.task_id for t in pools[0]} & {t.task_id for t in pools[1]}
    others = {t.task_id for t in warmstart_tasks(suite, 100, 0) + base_tasks(suite, 100)}
    assert not others & {t.task_id for p in pools for t in p}
    id_list, ood_list = eval_tasks(suite, "id", 6, types), eval_tasks(suite, "ood", 6, types)
    assert len(id_list) == len(ood_list) == 6
    assert {t.task_type for t in id_list} == {"beauty"} and {t.task_type for t in ood_list} == {"garden"}
    probe = Probe.collect(suite, ["id"], 6, 40, EVAL_ENVS, types)
    assert probe.steps["id"] and {s.observation.task for s in probe.steps["id"]} <= \
        {t.payload["instruction"] for t in id_list}
    with pytest.raises(ConfigError, match=r"^eval.episodes: 40 tasks asked, split id holds \d+ of run.task_types"):
        eval_tasks(suite, "id", 40, types)


def test_a_run_trains_and_evaluates_on_the_chosen_types(tmp_path, models_dir):
    config = make_config("webshop", tmp_path, models_dir, 'run.task_types=["electronics"]', "run.iterations=1",
                         "eval.every=1", "env.webshop.eval_instructions=40",
                         "env.webshop.train_instructions=400")
    store = RunStore(config.store.db)
    run_id = loop.train(config, store, config.store.mlflow_uri, console=quiet())
    trained = store.episodes(run_id, iteration=1)
    evaluated = [e for ev in store.evaluations(run_id) for e in store.episodes(run_id, evaluation_id=ev["id"])]
    assert trained and evaluated and {e["task_type"] for e in trained + evaluated} == {"electronics"}


def test_the_base_policy_does_not_change():
    shipped, rare = load_config("alfworld"), load_config("alfworld-rare")
    assert rare.run.task_types == ("pick_two_obj_and_place",)
    assert base_version(shipped, "tiny") == base_version(rare, "tiny") == \
        base_version(load_config("alfworld", [RARE_SET]), "tiny")
    other_games = load_config("alfworld", ["env.alfworld.train_games=3000"])  # what shapes the base still counts
    assert base_version(shipped, "tiny") != base_version(other_games, "tiny")


@pytest.mark.parametrize("env, value, message", [
    ("alfworld", '["pick_two"]', "error: run.task_types: unknown ['pick_two']; allowed for alfworld: "
                                 "pick_and_place_simple, look_at_obj_in_light,"),
    ("webshop", '["pick_two_obj_and_place"]', "error: run.task_types: unknown ['pick_two_obj_and_place']; "
                                               "allowed for webshop: beauty, electronics,"),
    ("alfworld", '["look_at_obj_in_light", "look_at_obj_in_light"]', "error: run.task_types: duplicates"),
])
def test_a_bad_task_type_is_one_line_exit_2(tmp_path, env, value, message):
    result = CliRunner().invoke(app, ["train", "--recipe", env, "--set", f"run.task_types={value}",
                                      "--runs-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), lines
