"""Recipe schema, TOML loading, ``--set`` overrides and validation (docs/architecture.md, Config).

A recipe is a TOML file whose tables are the sections below; every key has a default, so a recipe
only states what differs. Validation is generic, driven by the dataclasses' type hints (bool, int,
float, str, Literal, tuple[X, ...], Optional, nested dataclass): unknown keys, wrong types and the
``ValueError`` of a section's ``__post_init__`` all become a one-line :class:`ConfigError` that
names the dotted key.
"""
from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

from envs.alfworld.config import AlfworldConfig
from envs.webshop.config import WebshopConfig
from milegpo_cli.credit import ALGORITHMS
from milegpo_cli.credit.config import CreditConfig, check_preset, nest_paper_keys
from milegpo_cli.errors import ConfigError
from milegpo_cli.typed import build

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"
SPLITS = ("train", "id", "ood")  # the task splits of every environment (envs/*/suite.py)


def _check(ok: bool, name: str, reason: str) -> None:
    if not ok:
        raise ValueError(f"{name}: {reason}")


def _positive(obj: Any, *names: str) -> None:
    for name in names:
        _check(getattr(obj, name) >= 1, name, f"must be >= 1, got {getattr(obj, name)}")


@dataclass(frozen=True)
class RunConfig:
    name: str = ""  # "" -> the trainer names the run from recipe, algo and seed
    algo: Literal[ALGORITHMS] = "milegpo"
    seed: int = 0
    iterations: int = 20
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:1" ... (accelerate decides under launch)
    mixed_precision: Literal["no", "fp16", "bf16"] = "no"
    threads: int = 1  # torch threads per process
    # PPO pools, evaluation lists and probe of these task types only (ALFWorld: env.alfworld.task_types;
    # WebShop: env.webshop.categories); the base policy is unchanged. () = every type
    task_types: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _positive(self, "iterations", "threads")
        _check(self.seed >= 0, "seed", f"must be >= 0, got {self.seed}")
        _check(len(set(self.task_types)) == len(self.task_types), "task_types",
               f"duplicates in {list(self.task_types)}")


@dataclass(frozen=True)
class EnvConfig:
    name: Literal["alfworld", "webshop"] = "alfworld"
    max_steps: int = 30
    oracle: Literal["all", "sample", "off"] = "sample"  # expert labels in training rollouts (ALFWorld: env.alfworld.oracle_share)
    alfworld: AlfworldConfig = field(default_factory=AlfworldConfig)
    webshop: WebshopConfig = field(default_factory=WebshopConfig)

    def __post_init__(self) -> None:
        _positive(self, "max_steps")


@dataclass(frozen=True)
class TinyConfig:
    """The local tiny Qwen2-architecture model (milegpo_cli/policy/tiny.py)."""

    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128
    vocab_size: int = 512

    def __post_init__(self) -> None:
        _positive(self, *(f.name for f in dataclasses.fields(self)))


@dataclass(frozen=True)
class PolicyConfig:
    model: str = "tiny"  # "tiny" | a Hugging Face name | a local folder
    action_mode: Literal["score", "generate"] = "score"
    history: int = 2  # (observation, action) pairs of history in the prompt
    max_prompt_tokens: int = 512
    max_new_tokens: int = 64
    temperature: float = 1.0
    invalid_penalty: float = 0.1
    score_norm: Literal["sum", "mean"] = "sum"  # score mode: candidate log-prob summed or averaged over its tokens
    lora: bool = False
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    tiny: TinyConfig = field(default_factory=TinyConfig)

    def __post_init__(self) -> None:
        _positive(self, "max_prompt_tokens", "max_new_tokens", "lora_r", "lora_alpha")
        _check(self.history >= 0, "history", f"must be >= 0, got {self.history}")
        _check(self.temperature > 0, "temperature", f"must be > 0, got {self.temperature}")
        _check(self.invalid_penalty >= 0, "invalid_penalty", f"must be >= 0, got {self.invalid_penalty}")
        _check(0 <= self.lora_dropout < 1, "lora_dropout", f"must be in [0, 1), got {self.lora_dropout}")


@dataclass(frozen=True)
class RolloutConfig:
    groups: int = 4  # tasks per iteration
    group_size: int = 8  # rollouts per task (N)
    success_reward: float = 10.0  # reward of the winning step (verl-agent: 10 x success)
    train_tasks: int = 64  # PPO task pool: a block of the train split's PPO range chosen by the seed (trainer/task_pools.py)
    lanes: int = 1  # groups split into lanes that take turns: the policy acts for one while the engine steps another (trainer/rollout.py)
    threads: int = 0  # torch threads while rolling out (training and evaluation); 0 = run.threads. With engine workers, leave them a core

    def __post_init__(self) -> None:
        _positive(self, "groups", "group_size", "train_tasks", "lanes")
        _check(self.threads >= 0, "threads", f"must be >= 0, got {self.threads}")
        _check(self.train_tasks >= self.groups, "train_tasks",
               f"must be >= rollout.groups ({self.groups}), got {self.train_tasks}")


@dataclass(frozen=True)
class PPOConfig:
    lr: float = 1e-4
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    warmup_iterations: int = 0
    epochs: int = 1
    minibatch_size: int = 64  # steps per optimiser step
    micro_batch_size: int = 0  # steps per forward/backward within a minibatch (gradient accumulation; steps sorted by length); 0 = minibatch_size
    clip: float = 0.2
    clip_c: float = 3.0  # dual-clip constant
    kl_coef: float = 0.0
    entropy_coef: float = 0.001
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    max_bad_updates: int = 3  # consecutive updates skipped for NaN/inf before training stops
    target_kl: float = 0.0  # stop the update when a minibatch's approx_kl exceeds 1.5 x target_kl (SB3); 0 = off
    advantage_norm: Literal["none", "scale", "whiten"] = "none"  # batch: /std (zeros stay 0) or (A - mean)/std
    loss_agg: Literal["token-mean", "sequence-mean", "episode-mean"] = "token-mean"  # weight of a token in the loss

    def __post_init__(self) -> None:
        _positive(self, "epochs", "minibatch_size", "max_bad_updates")
        _check(self.micro_batch_size >= 0, "micro_batch_size", f"must be >= 0, got {self.micro_batch_size}")
        _check(self.lr > 0, "lr", f"must be > 0, got {self.lr}")
        _check(self.target_kl >= 0, "target_kl", f"must be >= 0, got {self.target_kl}")
        _check(0 < self.clip < 1, "clip", f"must be in (0, 1), got {self.clip}")
        _check(self.clip_c > 1, "clip_c", f"must be > 1, got {self.clip_c}")
        _check(self.max_grad_norm > 0, "max_grad_norm", f"must be > 0, got {self.max_grad_norm}")
        for name in ("warmup_iterations", "kl_coef", "entropy_coef", "weight_decay"):
            _check(getattr(self, name) >= 0, name, f"must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class EvalConfig:
    every: int = 5  # iterations between evaluations
    episodes: int = 16  # fixed tasks per split
    splits: tuple[str, ...] = ("id", "ood")
    temperature: float = 0.4
    greedy: bool = False
    probe_states: int = 256  # held-out expert states per split for the probe (0 = no probe)
    untrained: bool = True  # also evaluate the untrained model when PPO starts from a base or warm start

    def __post_init__(self) -> None:
        _positive(self, "every", "episodes")
        _check(self.probe_states >= 0, "probe_states", f"must be >= 0, got {self.probe_states}")
        _check(self.temperature > 0, "temperature", f"must be > 0, got {self.temperature}")
        unknown = [s for s in self.splits if s not in SPLITS]
        _check(not unknown, "splits", f"unknown {unknown} (allowed: {', '.join(SPLITS)})")


@dataclass(frozen=True)
class WarmStartConfig:
    """Supervised warm start on expert walkthroughs (reported with the run when enabled)."""

    enabled: bool = False
    episodes: int = 32
    epochs: int = 2
    lr: float = 1e-3

    def __post_init__(self) -> None:
        _positive(self, "episodes", "epochs")
        _check(self.lr > 0, "lr", f"must be > 0, got {self.lr}")


@dataclass(frozen=True)
class BaseConfig:
    """The cached base policy PPO starts from (trainer/base_policy.py): the tiny model trained once by
    supervised learning on expert walkthroughs of train games disjoint from every PPO pool and
    evaluation list; versioned by everything that shapes it."""

    enabled: bool = False
    walkthroughs: int = 400
    epochs: int = 4
    lr: float = 3e-3
    minibatch_size: int = 16
    seed: int = 0  # seed of the supervised training (minibatch order): another seed, another base policy

    def __post_init__(self) -> None:
        _positive(self, "walkthroughs", "epochs", "minibatch_size")
        _check(self.seed >= 0, "seed", f"must be >= 0, got {self.seed}")
        _check(self.lr > 0, "lr", f"must be > 0, got {self.lr}")


@dataclass(frozen=True)
class CheckpointConfig:
    every: int = 5
    keep: int = 2  # newest checkpoints kept on disk

    def __post_init__(self) -> None:
        _positive(self, "every", "keep")


def default_db_url(root: str | Path = "runs") -> str:
    return f"sqlite:///{Path(root) / 'milegpo.db'}"


def default_tracking_uri(root: str | Path = "runs") -> str:
    """A sqlite MLflow store: the file store is refused by mlflow 3.17 unless MLFLOW_ALLOW_FILE_STORE
    is set; a fresh sqlite store costs ~2 s once, then ~0.2 s to open."""
    return f"sqlite:///{Path(root) / 'mlflow.db'}"


@dataclass(frozen=True)
class StoreConfig:
    root: str = "runs"  # run directory: databases, checkpoints, models, artifacts
    db: str = ""  # SQLAlchemy URL; "" -> sqlite:///<root>/milegpo.db
    mlflow_uri: str = ""  # MLflow tracking URI; "" -> sqlite:///<root>/mlflow.db

    def __post_init__(self) -> None:
        _check(bool(self.root), "root", "must not be empty")
        object.__setattr__(self, "db", self.db or default_db_url(self.root))
        object.__setattr__(self, "mlflow_uri", self.mlflow_uri or default_tracking_uri(self.root))


@dataclass(frozen=True)
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    credit: CreditConfig = field(default_factory=CreditConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    warmstart: WarmStartConfig = field(default_factory=WarmStartConfig)
    base: BaseConfig = field(default_factory=BaseConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    recipe: str = ""  # where it came from (name or path), filled by load_config

    def __post_init__(self) -> None:
        """The default ALFWorld game cache follows the run directory (nothing written outside it);
        ``run.task_types`` are the environment's."""
        alf = self.env.alfworld
        if alf.data_dir == AlfworldConfig.data_dir and self.store.root != StoreConfig.root:
            alf = dataclasses.replace(alf, data_dir=str(Path(self.store.root) / "alfworld"))
            object.__setattr__(self, "env", dataclasses.replace(self.env, alfworld=alf))
        allowed = self.env.alfworld.task_types if self.env.name == "alfworld" else self.env.webshop.categories
        unknown = [t for t in self.run.task_types if t not in allowed]
        if unknown:
            raise ConfigError(f"run.task_types: unknown {unknown}; allowed for {self.env.name}: {', '.join(allowed)}")

    def to_dict(self) -> dict[str, Any]:
        """The resolved config as JSON/TOML-compatible values (tuples become lists)."""
        return _plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Config:
        """From a recipe or a stored config (flat ``credit.paper_*`` keys of earlier versions accepted)."""
        if isinstance(data.get("credit"), Mapping):
            data = {**data, "credit": nest_paper_keys(dict(data["credit"]))}
        return build(cls, data)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# --- recipes and overrides --------------------------------------------------------------------

def available_recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.toml"))


def recipe_path(recipe: str | Path) -> Path:
    """A recipe name in recipes/ (``alfworld``) or a path to a TOML file."""
    path = Path(recipe)
    if path.suffix == ".toml" or len(path.parts) > 1:
        if not path.is_file():
            raise ConfigError(f"recipe file not found: {path}")
        return path
    path = RECIPES_DIR / f"{recipe}.toml"
    if not path.is_file():
        raise ConfigError(f"recipe '{recipe}' not found (available: {', '.join(available_recipes())})")
    return path


def read_recipe(recipe: str | Path) -> dict[str, Any]:
    path = recipe_path(recipe)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        msg, where = _split_position(str(err))
        raise ConfigError(f"recipe {recipe}: TOML syntax error{where}: {msg}") from None
    except RecursionError:  # tomllib recurses per level: a few hundred levels exhaust Python's stack
        raise ConfigError(f"recipe {recipe}: TOML nested too deep") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"recipe {recipe}: cannot read {path}: {err}") from None


def _split_position(message: str) -> tuple[str, str]:
    """tomllib's "Invalid value (at line 3, column 7)" -> ("Invalid value", " at line 3, column 7")."""
    match = re.fullmatch(r"(.*) \((at line \d+, column \d+|at end of document)\)", message, re.S)
    return (match.group(1), f" {match.group(2)}") if match else (message, "")


def parse_value(text: str) -> Any:
    """A ``--set`` value: a TOML value (``3``, ``1e-4``, ``true``, ``["id"]``), else the bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    except RecursionError:  # see read_recipe
        raise ConfigError(f"value {text[:40]}...: TOML nested too deep") from None


def parse_override(text: str) -> tuple[str, Any]:
    """``section.key=value`` -> ("section.key", typed value)."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"bad override '{text}': expected section.key=value")
    return key, parse_value(value.strip())


def credit_overrides(overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``milegpo credit --set [credit.]key=value`` -> validated {key: value} of the [credit] section."""
    values: dict[str, Any] = {}
    for key, value in map(parse_override, overrides):
        *tables, name = key.removeprefix("credit.").split(".")
        node = values
        for table in tables:
            node = node.setdefault(table, {})
        node[name] = value
    values = nest_paper_keys(values)
    _check_preset(values, "credit.")
    build(CreditConfig, values, "credit.")
    return values


def _apply(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    if len(parts) < 2 or not all(parts):
        raise ConfigError(f"bad override key '{key}': expected section.key")
    node = data
    for i, part in enumerate(parts[:-1]):
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"bad override key '{key}': '{'.'.join(parts[:i + 1])}' is not a table")
    node[parts[-1]] = value


def load_config(recipe: str | Path, overrides: list[str] | tuple[str, ...] = (),
                flags: Mapping[str, Any] | None = None) -> Config:
    """Recipe, then ``--set`` overrides in order, then typed ``flags`` (dotted key -> value; None
    values are skipped, e.g. ``{"run.seed": 2, "policy.model": None}``)."""
    data = read_recipe(recipe)
    if "recipe" in data:
        raise ConfigError("unknown key 'recipe' (a recipe does not name itself)")
    for text in overrides:
        _apply(data, *parse_override(text))
    for key, value in (flags or {}).items():
        if value is not None:
            _apply(data, key, value)
    data["recipe"] = str(recipe)
    _check_preset(data.get("credit"), "credit.")
    return Config.from_dict(data)


def _check_preset(credit: Any, prefix: str) -> None:
    """The recipe's and the overrides' [credit] keys against the preset's (credit/config.py)."""
    if isinstance(credit, Mapping):
        try:
            check_preset(dict(credit))
        except ValueError as err:
            raise ConfigError(f"{prefix}{err}") from None


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"ppo": {"lr": 1e-4}} -> {"ppo.lr": 1e-4} (MLflow params)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
