"""Recipe loading, overrides and validation errors (milegpo_cli/config.py)."""
import dataclasses
import re
import typing

import pytest

from milegpo_cli.config import (ALGORITHMS, RECIPES_DIR, Config, RunConfig, available_recipes, credit_overrides, flatten,
                                load_config, parse_override, parse_value)
from milegpo_cli.errors import ConfigError


def write(tmp_path, text, name="r.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("recipe", ["alfworld", "webshop", "alfworld-paper", "webshop-paper"])
def test_shipped_recipes_load_and_round_trip(recipe):
    config = load_config(recipe)
    assert config.env.name == recipe.split("-")[0]
    assert config.recipe == recipe
    again = Config.from_dict(config.to_dict())
    assert again == config
    assert again.to_dict() == config.to_dict()


def test_shipped_recipe_names():
    assert {"alfworld", "webshop", "alfworld-paper", "webshop-paper"} <= set(available_recipes())
    assert RECIPES_DIR.is_dir()


def test_paper_recipes_follow_the_paper_setting():
    c = load_config("alfworld-paper")
    assert (c.policy.model, c.policy.action_mode, c.policy.lora) == ("Qwen/Qwen2.5-1.5B-Instruct", "generate", True)
    assert (c.rollout.groups, c.rollout.group_size, c.env.max_steps) == (16, 8, 50)
    assert (c.ppo.lr, c.ppo.kl_coef) == (1e-6, 0.01)
    assert load_config("webshop-paper").env.max_steps == 15


def test_defaults_fill_missing_sections(tmp_path):
    c = load_config(write(tmp_path, "[run]\nseed = 3\n"))
    assert c.run.seed == 3
    assert c.ppo == type(c.ppo)()
    assert c.store.db == "sqlite:///runs/milegpo.db"
    assert c.store.mlflow_uri == "sqlite:///runs/mlflow.db"


def test_store_urls_follow_root(tmp_path):
    c = load_config(write(tmp_path, '[store]\nroot = "elsewhere"\n'))
    assert c.store.db == "sqlite:///elsewhere/milegpo.db"
    assert c.store.mlflow_uri == "sqlite:///elsewhere/mlflow.db"


def test_overrides_are_typed_and_ordered():
    c = load_config("alfworld", ["ppo.lr=1e-3", "eval.greedy=true", "eval.splits=[\"ood\"]",
                                 "policy.model=Qwen/Qwen2.5-0.5B", "run.seed=1", "run.seed=7",
                                 "policy.tiny.hidden_size=32", "credit.drop=[\"reliability\"]"])
    assert c.ppo.lr == 1e-3 and isinstance(c.ppo.lr, float)
    assert c.eval.greedy is True
    assert c.eval.splits == ("ood",)
    assert c.policy.model == "Qwen/Qwen2.5-0.5B"
    assert c.run.seed == 7
    assert c.policy.tiny.hidden_size == 32
    assert c.credit.drop == ("reliability",)


def test_int_is_accepted_for_float_and_lone_string_for_list():
    c = load_config("alfworld", ["ppo.lr=1", "eval.splits=id"])
    assert c.ppo.lr == 1.0 and isinstance(c.ppo.lr, float)
    assert c.eval.splits == ("id",)


def test_flags_override_sets_and_skip_none():
    c = load_config("alfworld", ["run.seed=1"], {"run.seed": 5, "policy.model": None, "credit.drop": ["progress"]})
    assert c.run.seed == 5
    assert c.policy.model == "tiny"
    assert c.credit.drop == ("progress",)


@pytest.mark.parametrize("override, message", [
    ("ppo.lrr=3", "unknown key 'ppo.lrr' (allowed: lr, lr_schedule,"),
    ("nosection.x=3", "unknown key 'nosection' (allowed: run, env,"),
    ("policy.tiny.width=3", "unknown key 'policy.tiny.width'"),
    ("ppo.lr=abc", "ppo.lr: expected float, got 'abc'"),
    ("run.seed=1.5", "run.seed: expected int, got 1.5"),
    ("run.seed=true", "run.seed: expected int, got True"),
    ("eval.greedy=1", "eval.greedy: expected bool (true/false), got 1"),
    ("ppo.lr=nan", "ppo.lr: expected a finite float, got nan"),
    ("run.algo=ppo", "run.algo: expected one of 'grpo', 'gigpo', 'graphgpo', 'milegpo', 'hgpo', got 'ppo'"),
    ("ppo.lr_schedule=step", "ppo.lr_schedule: expected one of 'constant', 'linear', 'cosine'"),
    ("eval.splits=[1]", "eval.splits[0]: expected str, got 1"),
    ("ppo=3", "bad override key 'ppo': expected section.key"),
    ("rollout.group_size=0", "rollout.group_size: must be >= 1, got 0"),
    ("run.iterations=-2", "run.iterations: must be >= 1, got -2"),
    ("credit.gamma=2", "credit.gamma: must be in"),
    ("credit.drop=[\"everything\"]", "credit.drop: unknown component"),
    ("ppo.lr.x=1", "'ppo.lr' is not a table"),
    ("seed=1", "bad override key 'seed': expected section.key"),
    ("run.seed", "bad override 'run.seed': expected section.key=value"),
])
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ConfigError) as err:
        load_config("alfworld", [override])
    text = str(err.value)
    assert message in text, text
    assert "\n" not in text


def test_toml_syntax_error_names_line(tmp_path):
    path = write(tmp_path, "[run]\nseed = 1\nalgo = \n")
    with pytest.raises(ConfigError, match=r"TOML syntax error at line 3, column \d+: "):
        load_config(path)


def test_section_must_be_a_table(tmp_path):
    with pytest.raises(ConfigError, match="^ppo: expected a table, got 3$"):
        load_config(write(tmp_path, "ppo = 3\n"))


def test_missing_recipes(tmp_path):
    with pytest.raises(ConfigError, match=r"recipe 'nope' not found \(available: .*alfworld"):
        load_config("nope")
    with pytest.raises(ConfigError, match="recipe file not found"):
        load_config(tmp_path / "missing.toml")


def test_recipe_cannot_name_itself(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'recipe'"):
        load_config(write(tmp_path, 'recipe = "x"\n'))


def test_configs_are_frozen():
    c = load_config("alfworld")
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.run.seed = 3


def test_parse_value():
    assert parse_value("3") == 3
    assert parse_value("0.5") == 0.5
    assert parse_value("false") is False
    assert parse_value('["a", "b"]') == ["a", "b"]
    assert parse_value("hello world") == "hello world"
    assert parse_value("") == ""
    assert parse_override("credit.gamma = 0.9") == ("credit.gamma", 0.9)


def test_flatten():
    assert flatten({"a": {"b": 1, "c": {"d": [1]}}, "e": 2}) == {"a.b": 1, "a.c.d": [1], "e": 2}


def test_algorithms_match_the_credit_registry():
    from milegpo_cli.credit import ALGORITHMS as REGISTERED

    assert tuple(REGISTERED) == ALGORITHMS
    assert typing.get_args(typing.get_type_hints(RunConfig)["algo"]) == ALGORITHMS


@pytest.mark.parametrize("recipe, sets, message", [
    ("alfworld", ['credit.preset="verl-agent"', "credit.gamma=0.5"],
     "credit.gamma: 0.5 conflicts with preset 'verl-agent', which sets gamma = 0.95"),
    ("alfworld", ["credit.gamma=0.5", 'credit.preset="verl-agent"'], "credit.gamma: 0.5 conflicts"),
    ("alfworld", ['credit.preset="verl-agent"', 'credit.episode_stats="rollouts"'],  # the default, given
     "credit.episode_stats: 'rollouts' conflicts with preset 'verl-agent', which sets episode_stats = 'steps'"),
    ("alfworld", ['credit.preset="verl-agent"', 'credit.step_norm="mean"'], "credit.step_norm: 'mean' conflicts"),
])
def test_a_preset_refuses_a_value_the_user_gave(recipe, sets, message):
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}"):
        load_config(recipe, sets)
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}"):
        credit_overrides(sets)


def test_a_preset_takes_values_equal_to_its_own():
    config = load_config("webshop", ['credit.preset="verl-agent"', "credit.gamma=0.95"])  # step_norm = episode_norm
    assert (config.credit.gamma, config.credit.step_norm, config.credit.episode_stats) == (0.95, "mean", "steps")


def test_paper_weights_are_a_nested_section_and_flat_keys_still_load():
    from milegpo_cli.credit.config import PaperConfig

    assert load_config("webshop").credit.paper.eta == 1.0
    assert load_config("alfworld", ["credit.paper.omega=0.5"]).credit.paper.omega == 0.5
    stored = load_config("alfworld").to_dict()  # a run stored before issue 44: flat paper_* keys
    paper = stored["credit"].pop("paper")
    stored["credit"].update({f"paper_{'lambda' if k == 'lambda_' else k}": v for k, v in paper.items()}, paper_eta=0.7)
    assert Config.from_dict(stored).credit.paper == dataclasses.replace(PaperConfig(), eta=0.7)
    assert credit_overrides(["credit.paper_eta=0.3", "credit.paper.w_s=2.0"]) == {"paper": {"eta": 0.3, "w_s": 2.0}}
    with pytest.raises(ConfigError, match=r"^credit\.paper\.omega: must be in \(0, 1\]"):
        load_config("alfworld", ["credit.paper.omega=0"])
