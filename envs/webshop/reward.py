"""WebShop's purchase reward (Yao et al., 2022, "WebShop", section 3.1), rule for rule as the original
``get_reward`` of web_agent_site/engine/goal.py (with ``normalize_color`` of engine/normalize.py):

    score = r_type * (n_att + n_opt + 1[y_price <= u_price]) / (|U_att| + |U_opt| + 1)

U = the goal, Y = the purchased product and its chosen options.
- n_att: goal attributes g with token_set_ratio(p, g) > 85 for some product attribute p, or else g a
  substring of the lower-cased title, of the lower-cased bullet points joined by spaces, or of the
  lower-cased description (each field searched on its own).
- n_opt: goal option values g matched by some purchased option value p, token_set_ratio(p, g) > 85,
  both colour-normalised first (a value becomes the first colour word it contains: "dark teal" ->
  "dark"); every option group alike (size too), each goal option counted once, so n_opt <= |U_opt|.
- r_type = 1, lowered to 0.5 when neither the query, >= 2 breadcrumb components, nor a title-noun
  score > 0.2 match; 0.1 when the title-noun score < 0.1; 0 when it is 0. Title-noun score =
  |set(nouns(Y)) & set(nouns(U))| / len(nouns(U)) (repeats counted in the divisor), 0.2 when U has no
  noun; the nouns are Product.nouns (catalogue.py: the type's nouns, or spaCy's, ``type_nouns``).
``token_set_ratio`` is thefuzz's with its defaults (ASCII forced: U+0080-U+00FF dropped; full_process).
Where the original raises, the result is defined here: a price limit <= 0 is a limit like any other
(met only by a price <= it, so by no positive price); a goal without attributes has r_att = None.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import product as combinations

from thefuzz import fuzz

from envs.webshop.catalogue import Product
from envs.webshop.goals import Goal

FUZZY_THRESHOLD = 85
# normalize.py COLOR_SET, in its order (the first word contained in a value wins)
COLOR_WORDS = tuple("""
    alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze brown burgundy
    camel camo caramel champagne charcoal cheetah chestnut chocolate christmas coffee cognac copper coral
    cranberry cream crystal dark denim eggplant elephant espresso fuchsia gold granite grape graphite grass
    gray green grey heather indigo ivory ivy khaki lavender lemon leopard light lilac lime magenta maroon
    mauve merlot midnight mint mocha multicolor mushroom mustard natural navy nude olive orange peach pewter
    pink plum purple rainbow red rose royal rust sand sapphire seashell silver skull slate steel stone
    stonewash sunflower tan taupe teal tiger turquoise violet walnut wheat white wine yellow""".split())


@lru_cache(maxsize=1 << 16)
def normalize_color(value: str) -> str:
    """The first colour word that ``value`` contains (as a substring), else ``value`` itself."""
    return next((c for c in COLOR_WORDS if c in value), value)


@lru_cache(maxsize=1 << 16)
def fuzzy_match(a: str, b: str) -> bool:
    """thefuzz token_set_ratio(a, b) > 85."""
    return fuzz.token_set_ratio(a, b) > FUZZY_THRESHOLD


@dataclass(frozen=True)
class RewardInfo:
    score: float
    r_type: float
    r_att: float | None
    r_option: float | None
    r_price: bool
    query_match: bool
    category_match: bool
    title_score: float


def type_reward(product: Product, goal: Goal) -> tuple[float, bool, bool, float]:
    """(r_type, query_match, category_match, title_score) as in goal.py get_type_reward."""
    query_match = product.query == goal.query
    cats_p = {x.strip() for x in product.product_category.split("›")}
    cats_g = {x.strip() for x in goal.product_category.split("›")}
    category_match = len(cats_p & cats_g) >= 2
    title_score = len(set(product.nouns) & set(goal.nouns)) / len(goal.nouns) if goal.nouns else 0.2
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return r_type, query_match, category_match, title_score


def attribute_matches(product: Product, goal: Goal) -> int:
    """n_att: goal attributes matched by a product attribute or found in one text field."""
    fields = (product.title.lower(), " ".join(product.features).lower(), product.description.lower())
    return sum(1 for g in goal.attributes
               if any(fuzzy_match(p, g) for p in product.attributes) or any(g in f for f in fields))


def _option_mask(value: str, goal_values: tuple[str, ...]) -> int:
    """Bit j set when the purchased ``value`` matches goal option value j (both colour-normalised)."""
    v = normalize_color(value)
    return sum(1 << j for j, g in enumerate(goal_values) if fuzzy_match(v, normalize_color(g)))


def _goal_values(goal: Goal) -> tuple[str, ...]:
    return tuple(v for _, v in goal.options)


def _score(product: Product, goal: Goal, n_opt: int) -> RewardInfo:
    r_type, query_match, category_match, title_score = type_reward(product, goal)
    r_price = product.price <= goal.price_upper
    n_att = attribute_matches(product, goal)
    n_goal_opts = len(goal.options)
    total = (n_att + n_opt + int(r_price)) / (len(goal.attributes) + n_goal_opts + 1)
    return RewardInfo(score=total * r_type, r_type=r_type,
                      r_att=n_att / len(goal.attributes) if goal.attributes else None,
                      r_option=n_opt / n_goal_opts if n_goal_opts else None, r_price=r_price,
                      query_match=query_match, category_match=category_match, title_score=title_score)


def get_reward(product: Product, goal: Goal, options: dict[str, str]) -> RewardInfo:
    """The purchase score of ``product`` bought with ``options`` (group -> value) for ``goal``."""
    goal_values = _goal_values(goal)
    mask = 0
    for value in options.values():
        mask |= _option_mask(value, goal_values)
    return _score(product, goal, mask.bit_count())


def matching_values(product: Product, goal: Goal) -> dict[str, frozenset[str]]:
    """Per option group of ``product``, the values that match some goal option (empty groups left out)."""
    goal_values = _goal_values(goal)
    out = {}
    for group, values in product.options:
        ok = frozenset(v for v in values if _option_mask(v, goal_values))
        if ok:
            out[group] = ok
    return out


def best_score(product: Product, goal: Goal) -> float:
    """The highest score reachable by buying ``product``: the best of all choices of at most one value
    per option group."""
    goal_values = _goal_values(goal)
    masks = [{0} | {_option_mask(v, goal_values) for v in values} for _, values in product.options]
    best_opt = 0
    for choice in combinations(*masks):
        mask = 0
        for m in choice:
            mask |= m
        best_opt = max(best_opt, mask.bit_count())
    return _score(product, goal, best_opt).score
