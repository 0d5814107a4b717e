"""Credit hyperparameters: the ``[credit]`` recipe section (docs/algorithms.md)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal

from milegpo_cli.typed import check_fields

DROPPABLE = ("reliability", "progress", "same-state", "branch", "traps", "milestones", "memory")
COMPONENTS = tuple(n for n in DROPPABLE if n != "branch")  # MileGPO's components ("branch": alias of same-state)
NORMS = ("mean_std", "mean")
EPISODE_STATS = ("rollouts", "steps")
EPISODE_SCORES = ("outcome", "success")
FORMULATIONS = ("v3", "v2", "paper")
OLD_FORMULATIONS = {"ours": "v2"}  # accepted, read as their current name
PRESETS = ("", "verl-agent")
GRAPH_FINALS = ("fail", "observed")
GRAPH_UNREACHABLES = ("zero", "farthest")
MAX_MAGNITUDE = 1e9  # of every float setting: larger weights overflow the advantages to inf (1e308 did)
# verl-agent's GiGPO conventions (docs/algorithms.md, preset; gigpo/core_gigpo.py): statistics over step rows, one
# normalisation mode for both levels, episode score 10 x success, invalid-format penalty 0.1 on that row.
# recipe/GraphGPO (core_graph.py, rollout_loop.py, graphgpo_ray_trainer.py) adds its three graph conventions.
VERL_AGENT = {"episode_stats": "steps", "anchor_visits": False, "zero_identical": False, "std_unbiased": True, "eps": 1e-6, "episode_score": "success",
              "episode_scale": 10.0, "invalid_penalty": 0.1, "gamma": 0.95, "omega": 1.0,
              "graph_final": "observed", "graph_unreachable": "farthest", "graph_invalid": True}


# The public recipes' settings per environment (run_qwen2.5_1.5b_*_train.sh): recipe/GraphGPO's gamma (its graph
# gamma_G) and mode, recipe/hgpo's mode. A baseline row of `ablate` runs the preset with these (experiments/ablate.py).
RECIPE_SETTINGS = {("graphgpo", "alfworld"): {"graph_gamma": 0.1, "episode_norm": "mean_std"},
                   ("graphgpo", "webshop"): {"graph_gamma": 0.2, "episode_norm": "mean_std"},
                   ("hgpo", "alfworld"): {"episode_norm": "mean_std"}, ("hgpo", "webshop"): {"episode_norm": "mean"}}


def canonical_formulation(name: str) -> str:
    """A formulation's current name ("ours", the old name of "v2", read as "v2")."""
    return OLD_FORMULATIONS.get(name, name)


def check_preset(given: dict) -> None:
    """Refuse a ``[credit]`` key that a recipe or ``--set`` gives a value the preset fixes otherwise
    (ValueError naming both). ``CreditConfig(preset=...)`` itself sets the preset's values
    (docs/algorithms.md, "The verl-agent preset")."""
    if given.get("preset") != "verl-agent":
        return
    fixed = {**VERL_AGENT, "step_norm": given.get("episode_norm", CreditConfig.episode_norm)}
    for name, value in fixed.items():
        if name in given and given[name] != value:
            raise ValueError(f"{name}: {given[name]!r} conflicts with preset 'verl-agent', which sets {name} = "
                             f"{value!r}: give one or the other")


def canonical_drop(drop) -> frozenset[str]:
    """Validate ablation names; ``branch`` is an alias of ``same-state``."""
    names = {drop} if isinstance(drop, str) else set(drop)
    unknown = sorted(names - set(DROPPABLE))
    if unknown:
        raise ValueError(f"drop: unknown component(s) {unknown}; allowed: {', '.join(DROPPABLE)}")
    return frozenset("same-state" if n == "branch" else n for n in names)


@dataclass(frozen=True)
class PaperConfig:
    """MileGPO, the paper's construction (``formulation = "paper"``, the ``[credit.paper]`` section;
    docs/algorithms.md); weights the summary does not report are 1."""

    eta: float = 0.2  # ALFWorld 0.2, WebShop 1.0
    omega: float = 0.2  # potential decay with distance
    gamma_phi: float = 1.0
    lambda_: float = 0.25  # the paper's lambda
    w_plus: float = 1.0
    w_minus: float = 0.25
    w_s: float = 1.0
    w_m: float = 1.0
    w_c: float = 1.0
    w_f: float = 1.0
    w_l: float = 1.0
    alpha_d: float = 1.0
    alpha_s: float = 1.0
    alpha_f: float = 1.0
    w_bc: float = 1.0
    w_pg: float = 1.0
    w_pcc: float = 1.0
    reject: float = 0.0  # scale of candidates that PCC rejects (0 on ALFWorld)

    def __post_init__(self) -> None:
        check_fields(self)
        _check_magnitudes(self)
        if not 0.0 < self.omega <= 1.0:
            raise ValueError(f"omega: must be in (0, 1], got {self.omega}")
        for name in ("eta", "gamma_phi", "lambda_", "w_plus", "w_minus", "w_pcc", "reject"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")


def nest_paper_keys(credit: dict) -> dict:
    """A ``[credit]`` mapping with the flat ``paper_<name>`` keys of earlier versions (stored runs,
    older recipes) moved into its ``paper`` table (``paper_lambda`` -> ``paper.lambda_``)."""
    flat = {k: v for k, v in credit.items() if k.startswith("paper_")}
    if not flat:
        return credit
    paper = dict(credit.get("paper") or {})
    for key, value in flat.items():
        name = key.removeprefix("paper_")
        paper["lambda_" if name == "lambda" else name] = value  # given last (a grid's, an override's): it wins
    return {**{k: v for k, v in credit.items() if k not in flat}, "paper": paper}


def _check_magnitudes(config) -> None:
    for f in fields(config):
        if f.type in ("float", float) and abs(getattr(config, f.name)) > MAX_MAGNITUDE:
            raise ValueError(f"{f.name}: must be at most {MAX_MAGNITUDE:g} in magnitude, got {getattr(config, f.name)!r}")


@dataclass(frozen=True)
class CreditConfig:
    """Every credit hyperparameter with its default; ``paper``: those of ``formulation="paper"``."""

    # episode / step normalisation (GRPO, GiGPO; docs/algorithms.md, "GRPO and GiGPO")
    episode_norm: Literal[NORMS] = "mean_std"
    step_norm: Literal[NORMS] = "mean_std"  # anchor-group normalisation of step returns
    episode_stats: Literal[EPISODE_STATS] = "rollouts"  # "rollouts" (default) | "steps" (verl-agent: one entry per step row)
    std_unbiased: bool = True  # torch.std default, as in verl-agent
    eps: float = 1e-6
    episode_scale: float = 1.0  # multiplies R_i before normalisation (verl-agent mean_norm uses 10 x success)
    episode_score: Literal[EPISODE_SCORES] = "outcome"  # R_i = the outcome, or "success": the success indicator (verl-agent)
    invalid_penalty: float = 0.0  # taken off the episode score and the discounted return of a step row
    # flagged invalid (Rollout.invalid); 0 when the rewards already carry the penalty (our trainer)
    similarity_thresh: float = 1.0  # anchor groups: 1 = exact key match; < 1 = verl-agent's greedy
    # SequenceMatcher clustering (enable_similarity) at this ratio
    anchor_visits: bool = True  # anchor group = (state, k-th visit in the rollout); False = the state alone (verl-agent,
    # the preset; why the default stays: docs/algorithms.md, "Decision, per estimator")
    zero_identical: bool = True  # a group of identical rollouts (or of one) gets advantage 0 on every step
    preset: Literal[PRESETS] = ""  # "verl-agent": fix the fields of VERL_AGENT (the recipe keeps choosing the norm)
    success_threshold: float = 1.0  # success = outcome >= threshold when a rollout does not say
    gamma: float = 0.95
    omega: float = 1.0  # step advantage weight
    # MileGPO, v3 and v2 (docs/algorithms.md): shared hyperparameters
    formulation: Literal[FORMULATIONS + tuple(OLD_FORMULATIONS)] = "v3"
    m_min: int = 2
    prior_strength: float = 2.0  # k of the empirical-Bayes Beta prior
    lambda_m: float = 0.5
    lambda_t: float = 1.0
    lambda_p: float = 2.0  # chosen from the credit diagnostics (docs/algorithms.md "Choosing the defaults")
    g_p: float = 0.5  # credit factor of a candidate that fails the progress gate (v2: 0, docs/algorithms.md)
    g_b: float = 0.5  # credit factor of a candidate that fails the same-state branch test (v2: 0, docs/algorithms.md)
    # v3's memory across iterations of a task (credit/memory.py; needs rollouts with task / iteration)
    memory: bool = False  # off: training has not shown that it helps (docs/results_memory.md)
    memory_decay: float = 0.5  # delta: weight of evidence one iteration older (chosen in docs/results_memory.md)
    memory_floor: float = 0.05  # entries below this weight are forgotten; recalled transitions need it
    memory_states: int = 256  # states kept per task (the most visited), 4x as many transitions
    # GraphGPO (docs/algorithms.md, "GraphGPO"): step return c * gamma_G ** d
    graph_c: float = 10.0
    graph_gamma: float = 0.2
    graph_final: Literal[GRAPH_FINALS] = "fail"  # last step of a failed rollout: -> FAIL, or "observed": -> its recorded final_state
    # (FAIL where the rollout has none; recipe/GraphGPO, the preset; docs/algorithms.md says why "fail" stays)
    graph_unreachable: Literal[GRAPH_UNREACHABLES] = "zero"  # r^G where SUCCESS is unreachable: 0, or "farthest": d = max finite d + 1
    graph_invalid: bool = False  # take invalid_penalty off r^G of a flagged row too (recipe/GraphGPO)
    # HGPO (docs/algorithms.md, "HGPO"): hierarchy of history groups, recipe/hgpo/core_hgpo.py
    hgpo_history: int = 2  # history_length: groups keyed by the last k states, k = 1 .. hgpo_history + 1
    hgpo_alpha: float = 1.0  # length_weight_alpha: group weight (k + 1) ** alpha
    hgpo_base_group: bool = False  # base_group: add the episode advantage as a k = 0 group
    paper: PaperConfig = field(default_factory=PaperConfig)  # [credit.paper]: formulation = "paper"
    drop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Types and choices by the config's typed validator (typed.py, from the annotations), then ranges."""
        if self.preset == "verl-agent":
            for name, value in VERL_AGENT.items():
                object.__setattr__(self, name, value)
            object.__setattr__(self, "step_norm", self.episode_norm)  # verl-agent: one `mode` for both
        check_fields(self)
        object.__setattr__(self, "formulation", canonical_formulation(self.formulation))
        _check_magnitudes(self)
        if self.m_min < 1:
            raise ValueError(f"m_min: must be an integer >= 1, got {self.m_min!r}")
        if self.hgpo_history < 0:
            raise ValueError(f"hgpo_history: must be an integer >= 0, got {self.hgpo_history!r}")
        if self.memory_states < 1:
            raise ValueError(f"memory_states: must be an integer >= 1, got {self.memory_states!r}")
        for name in ("memory_decay", "memory_floor"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{name}: must be in (0, 1], got {getattr(self, name)}")
        if self.eps <= 0:
            raise ValueError(f"eps: must be > 0, got {self.eps}")
        if self.prior_strength <= 0:
            raise ValueError(f"prior_strength: must be > 0, got {self.prior_strength}")
        if not 0.0 < self.similarity_thresh <= 1.0:
            raise ValueError(f"similarity_thresh: must be in (0, 1], got {self.similarity_thresh}")
        for name in ("gamma", "graph_gamma"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}: must be in [0, 1], got {getattr(self, name)}")
        for name in ("omega", "invalid_penalty", "hgpo_alpha", "lambda_m", "lambda_t", "lambda_p", "g_p", "g_b", "graph_c"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
        for name in ("g_p", "g_b"):
            if getattr(self, name) > 1:
                raise ValueError(f"{name}: must be in [0, 1], got {getattr(self, name)}")
        canonical_drop(self.drop)

    @classmethod
    def from_dict(cls, values: dict) -> "CreditConfig":
        """Build from a recipe / override mapping; unknown keys are an error naming the allowed ones."""
        values = nest_paper_keys(values)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown credit key; allowed: {', '.join(sorted(known))}")
        return cls(**values)
