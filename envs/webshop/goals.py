"""Shopping goals and their instructions, in the style of WebShop's synthetic goals.

A goal names a product (its ASIN), 1-3 of its attributes, one value per option group and a price
limit. The price limit follows WebShop's ``get_synthetic_goals``: from the price grid 10, 20, ...,
990 take the first four points above the product price, sample two, keep the larger.
The instruction text is ``<core>[ with k: v, and k: v][, and price lower than P dollars]``.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from envs.webshop.catalogue import Product, types_of

PRICE_RANGE = tuple(10.0 * i for i in range(1, 100))
NO_PRICE_LIMIT = 1_000_000.0
CORE_TEMPLATES = ("i need {art}{phrase} that is {attrs}", "i am looking for {art}{attrs_adj} {phrase}",
                  "find me {art}{attrs_adj} {phrase}", "i want to buy {art}{phrase}, {attrs}")


@dataclass(frozen=True)
class Goal:
    asin: str
    instruction: str
    core: str  # the instruction without options and price
    attributes: tuple[str, ...]
    options: tuple[tuple[str, str], ...]  # (group, value) of the goal product
    price_upper: float
    query: str  # the goal product's crawl query (product type)
    nouns: tuple[str, ...]
    product_category: str
    category: str

    def to_payload(self) -> dict[str, Any]:
        return {"asin": self.asin, "instruction": self.instruction, "core": self.core,
                "attributes": list(self.attributes), "options": [list(o) for o in self.options],
                "price_upper": self.price_upper, "query": self.query, "nouns": list(self.nouns),
                "product_category": self.product_category, "category": self.category}

    @classmethod
    def from_payload(cls, d: dict[str, Any]) -> "Goal":
        return cls(d["asin"], d["instruction"], d["core"], tuple(d["attributes"]),
                   tuple((k, v) for k, v in d["options"]), float(d["price_upper"]), d["query"],
                   tuple(d["nouns"]), d["product_category"], d["category"])


def price_upper(price: float, rng: random.Random) -> float:
    grid = [p for p in PRICE_RANGE if p > price][:4]
    return sorted(rng.sample(grid, 2))[1] if len(grid) >= 2 else NO_PRICE_LIMIT


def _and(items: tuple[str, ...]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def make_goal(product: Product, rng: random.Random) -> Goal:
    attrs = tuple(rng.sample(product.attributes, rng.randint(1, min(3, len(product.attributes)))))
    options = tuple((g, rng.choice(vals)) for g, vals in product.options)
    art = "" if product.query.endswith("s") else "a "
    core = rng.choice(CORE_TEMPLATES).format(art=art, phrase=product.query, attrs=_and(attrs),
                                             attrs_adj=", ".join(attrs))
    core = re.sub(r"\ba (?=[aeio])", "an ", core)
    upper = price_upper(product.price, rng)
    option_text = " with " + ", and ".join(f"{k}: {v}" for k, v in options) if options else ""
    price_text = f", and price lower than {upper:.2f} dollars" if upper < NO_PRICE_LIMIT else ""
    return Goal(product.asin, core + option_text + price_text, core, attrs, options, upper, product.query,
                product.nouns, product.product_category, product.category)


def candidate_queries(goal: Goal, n: int, rng: random.Random) -> tuple[str, ...]:
    """The search[...] commands offered on the search page, in a task-seeded order.

    Up to four: product type + goal attributes, the instruction's core sentence, the product type
    alone, and a distractor (a sibling product type of the same category with the goal attributes).
    """
    types = [t for _, t in types_of(goal.category)]
    own = next(t.nouns for t in types if t.phrase == goal.query)  # the type's nouns, whatever type_nouns is
    siblings = [t.phrase for t in types if not set(t.nouns) & set(own)]
    queries = [" ".join((goal.query, *goal.attributes)), goal.core, goal.query,
               " ".join((rng.choice(siblings), *goal.attributes))]
    chosen = list(dict.fromkeys(queries))[:n]
    rng.shuffle(chosen)
    return tuple(chosen)
