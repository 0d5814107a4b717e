"""Configuration of the WebShop simulator (the recipe's ``[env.webshop]`` section)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from envs.base import EnvError

ALL_CATEGORIES = ("beauty", "electronics", "fashion", "grocery", "garden", "home_kitchen", "sports")


@dataclass(frozen=True)
class WebshopConfig:
    """Catalogue size, category split and instruction pools of the simulator.

    ID categories are those not listed in ``ood_categories``; their goal products are split into
    disjoint train / id pools (seen / unseen instructions). OOD instructions come only from
    ``ood_categories``, whose products are never goals of a training instruction.
    """

    seed: int = 0
    num_products: int = 5000
    categories: tuple[str, ...] = ALL_CATEGORIES
    ood_categories: tuple[str, ...] = ("garden", "sports")
    train_instructions: int = 2000  # size of the train instruction pool
    eval_instructions: int = 300  # size of each of the id and ood pools
    id_goal_fraction: float = 0.2  # share of ID-category products reserved as goals of id instructions
    results_per_page: int = 10  # WebShop's PRODUCT_WINDOW
    search_return_n: int = 50  # WebShop's SEARCH_RETURN_N
    num_query_candidates: int = 4  # search[...] commands offered on the search page
    step_timeout_s: float = 10.0  # a step running longer ends its episode as errored; 0 = no limit
    type_nouns: Literal["catalogue", "spacy"] = "catalogue"  # title nouns of the type reward (reward.py)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.categories) - set(ALL_CATEGORIES))
        if unknown:
            raise EnvError(f"categories: unknown {unknown}; allowed {list(ALL_CATEGORIES)}")
        if len(set(self.categories)) != len(self.categories):
            raise EnvError("categories: duplicates")
        if not set(self.ood_categories) <= set(self.categories):
            raise EnvError(f"ood_categories: {list(self.ood_categories)} must be a subset of categories")
        if not self.ood_categories or len(self.ood_categories) >= len(self.categories):
            raise EnvError("ood_categories: need at least one OOD and one ID category")
        if self.num_products < 20 * len(self.categories):
            raise EnvError(f"num_products: {self.num_products} < 20 per category ({20 * len(self.categories)})")
        for name in ("train_instructions", "eval_instructions", "results_per_page", "search_return_n"):
            if getattr(self, name) < 1:
                raise EnvError(f"{name}: must be >= 1")
        if not 0.0 < self.id_goal_fraction < 1.0:
            raise EnvError("id_goal_fraction: must be in (0, 1)")
        if not self.step_timeout_s >= 0:
            raise EnvError(f"step_timeout_s: must be >= 0, got {self.step_timeout_s}")
        if self.type_nouns not in ("catalogue", "spacy"):
            raise EnvError(f"type_nouns: {self.type_nouns!r}; allowed 'catalogue', 'spacy'")
        if not 1 <= self.num_query_candidates <= 4:
            raise EnvError("num_query_candidates: must be in 1..4")

    @property
    def id_categories(self) -> tuple[str, ...]:
        return tuple(c for c in self.categories if c not in self.ood_categories)
