"""WebShop's purchase reward (envs/webshop/reward.py) on a fixed table of cases whose values were
worked out by hand from the original's rules (web_agent_site/engine/goal.py, normalize.py).

Ratios below are thefuzz token_set_ratio: the best Indel ratio 2*LCS/(|a|+|b|) among the sorted token
intersection and intersection + rest of each side, after lower-casing and dropping U+0080-U+00FF.
"""
import itertools
import random

import pytest

from envs.base import EnvError
from envs.webshop import catalogue
from envs.webshop.catalogue import CATEGORIES, Product, generate_catalogue, load_spacy_english, title_nouns
from envs.webshop.config import WebshopConfig
from envs.webshop.goals import Goal, price_upper
from envs.webshop.reward import best_score, get_reward, matching_values, normalize_color, type_reward


def product(**kw) -> Product:
    base = dict(idx=0, asin="B000000001", category="beauty",
                product_category="Beauty & Personal Care › Skin Care › Face Moisturizer",
                query="face moisturizer", nouns=("face", "moisturizer"), title="Aurora Oil Free Face Moisturizer",
                attributes=("oil free", "sensitive skin", "paraben free"),
                features=("Oil free: thoroughly tested by our team",), description="A moisturizer for every day.",
                options=(("scent", ("lavender", "citrus")), ("size", ("2 fl oz", "4 fl oz", "16 fl oz"))),
                price=19.99)
    base.update(kw)
    return Product(**base)


def goal(**kw) -> Goal:
    base = dict(asin="B000000001", instruction="i need ...", core="i need ...",
                attributes=("sensitive skin", "paraben free"), options=(("scent", "citrus"), ("size", "4 fl oz")),
                price_upper=30.0, query="face moisturizer", nouns=("face", "moisturizer"),
                product_category="Beauty & Personal Care › Skin Care › Face Moisturizer", category="beauty")
    base.update(kw)
    return Goal(**base)


APPAREL = dict(options=(("color", ("black", "navy", "dark grey")), ("size", ("x-small", "small", "large"))))
OTHER_TYPE = dict(nouns=("face", "wash"), query="face wash", product_category="A › B › Face Wash")

# (id, product overrides, goal overrides, purchased options, hand-computed score)
CASES = [
    ("perfect", {}, {}, {"scent": "citrus", "size": "4 fl oz"}, 1.0),
    ("nothing_chosen", {}, {}, {}, (2 + 0 + 1) / 5),
    # 1. size is fuzzy like every option: {small} is a subset of {x, small} -> 100
    ("size_subset_tokens", APPAREL, dict(options=(("color", "black"), ("size", "small"))),
     {"color": "black", "size": "x-small"}, 1.0),
    # "4 fl oz" vs "2 fl oz": Indel("fl oz 4", "fl oz 2") = 12/14 -> 86 > 85: a match
    ("size_2_vs_4_fl_oz", {}, {}, {"scent": "citrus", "size": "2 fl oz"}, 1.0),
    # "fl oz 4" vs "fl oz 16" = 12/15 -> 80, sect "fl oz" vs "fl oz 16" = 10/13 -> 77: no match
    ("size_4_vs_16_fl_oz", {}, {}, {"scent": "citrus", "size": "16 fl oz"}, 4 / 5),
    # 2. no text fallback for options: lavender written in the description does not make it count
    ("no_option_text_fallback", dict(description="A moisturizer with a lavender note."), {},
     {"scent": "lavender", "size": "4 fl oz"}, 4 / 5),
    # 3. goal options are counted, once each: two purchased "navy" values match the one goal colour
    ("goal_option_counted_once", dict(options=(("color", ("navy",)), ("pattern", ("navy",)))),
     dict(options=(("color", "navy"), ("size", "large"))), {"color": "navy", "pattern": "navy"}, 4 / 5),
    # 4. colours normalised first: "dark grey" and "dark teal" both become "dark" (before grey/teal in
    # COLOR_SET); as raw strings Indel("dark grey", "dark teal") = 12/18 -> 67, no match
    ("colour_normalised", APPAREL, dict(options=(("color", "dark teal"), ("size", "small"))),
     {"color": "dark grey", "size": "small"}, 1.0),
    # "standard" contains "tan", so it normalises to the colour "tan"
    ("colour_in_style_word", dict(options=(("style", ("standard",)),)), dict(options=(("style", "tan"),)),
     {"style": "standard"}, 1.0),
    # 5. non-ASCII: U+0080-U+00FF dropped, "noé" -> "no" = "no" (100); "ł" is kept: Indel("noł", "no") = 4/5 -> 80
    ("latin1_dropped", dict(options=(("style", ("noé",)),)), dict(options=(("style", "no"),)), {"style": "noé"}, 1.0),
    ("beyond_latin1_kept", dict(options=(("style", ("noł",)),)), dict(options=(("style", "no"),)),
     {"style": "noł"}, (2 + 0 + 1) / 4),
    # 6. attribute text: each field on its own; "moisturizer oil" spans title and bullet points (no
    # match, and no product attribute is within 85 of it); bullet points are joined by spaces
    ("phrase_across_fields", {}, dict(attributes=("sensitive skin", "moisturizer oil")),
     {"scent": "citrus", "size": "4 fl oz"}, 4 / 5),
    ("phrase_across_bullets", dict(attributes=("oil free",), features=("Oil free: tested", "Vegan formula")),
     dict(attributes=("tested vegan",)), {"scent": "citrus", "size": "4 fl oz"}, 1.0),
    ("attribute_in_description", dict(attributes=("oil free",), description="Made for sensitive skin."),
     dict(attributes=("sensitive skin",)), {"scent": "citrus", "size": "4 fl oz"}, 1.0),
    # 7. type reward: title score 1/5 (repeats in the goal's list count): not > 0.2, no query or
    # breadcrumb match -> r_type 0.5; with a set divisor it would be 1/3 and r_type 1
    ("type_repeated_goal_nouns", OTHER_TYPE, dict(nouns=("face", "face", "moisturizer", "cream", "cream")),
     {"scent": "citrus", "size": "4 fl oz"}, 0.5),
    ("type_no_shared_noun", dict(nouns=("body", "lotion"), query="body lotion"), {},
     {"scent": "citrus", "size": "4 fl oz"}, 0.0),
    ("type_no_goal_nouns_query_matches", {}, dict(nouns=()), {"scent": "citrus", "size": "4 fl oz"}, 1.0),
    ("type_no_goal_nouns_other_type", OTHER_TYPE, dict(nouns=()), {"scent": "citrus", "size": "4 fl oz"}, 0.5),
    ("type_title_score_below_0_1", OTHER_TYPE, dict(nouns=tuple("abcdefghij") + ("face",)),
     {"scent": "citrus", "size": "4 fl oz"}, 0.1),
    # 8. price: equal to the limit is within it; a limit <= 0 is met by no positive price
    ("price_at_limit", dict(price=30.0), {}, {"scent": "citrus", "size": "4 fl oz"}, 1.0),
    ("price_over_limit", dict(price=35.0), {}, {"scent": "citrus", "size": "4 fl oz"}, 4 / 5),
    ("price_limit_zero", {}, dict(price_upper=0.0), {"scent": "citrus", "size": "4 fl oz"}, 4 / 5),
    ("price_limit_negative", {}, dict(price_upper=-10.0), {"scent": "citrus", "size": "4 fl oz"}, 4 / 5),
    # empty strings: an empty goal attribute is a substring of any text (a match); an empty option none
    ("empty_goal_attribute", {}, dict(attributes=("",)), {"scent": "citrus", "size": "4 fl oz"}, 1.0),
    ("empty_goal_option", {}, dict(options=(("scent", ""), ("size", "4 fl oz"))),
     {"scent": "citrus", "size": "4 fl oz"}, 4 / 5),
]


@pytest.mark.parametrize("p_kw,g_kw,options,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_reward_table(p_kw, g_kw, options, expected):
    assert get_reward(product(**p_kw), goal(**g_kw), options).score == pytest.approx(expected)


def test_reward_components():
    r = get_reward(product(price=35.0), goal(), {"scent": "citrus", "size": "16 fl oz"})
    assert (r.r_type, r.r_att, r.r_option, r.r_price) == (1.0, 1.0, 0.5, False)
    assert get_reward(product(), goal(options=()), {}).r_option is None
    assert get_reward(product(), goal(attributes=()), {}).r_att is None


def test_normalize_color_takes_first_listed_word():
    assert normalize_color("dark teal") == "dark" and normalize_color("light blue") == "blue"
    assert normalize_color("ash grey") == "ash" and normalize_color("unscented") == "unscented"


def test_type_reward_flags():
    assert type_reward(product(), goal()) == (1.0, True, True, 1.0)
    # shares one of two nouns (0.5 > 0.2): full type reward in another category
    assert type_reward(product(**OTHER_TYPE), goal()) == (1.0, False, False, 0.5)


def test_option_groups_of_the_catalogue_never_match_each_other():
    """Values of different option groups never match (what makes the oracle's per-group choice exact)."""
    pools = {vals: g for _, _, subs in CATEGORIES.values() for ts in subs.values() for t in ts for g, vals in t.options}
    for (va, ga), (vb, gb) in itertools.permutations(pools.items(), 2):
        if ga != gb:
            for a, b in itertools.product(va, vb):
                p = product(options=((ga, (a,)),))
                assert not matching_values(p, goal(options=((gb, b),))), (a, b)


def test_best_score_is_the_best_option_choice():
    p, g = product(), goal(options=(("scent", "citrus"), ("size", "8 fl oz")))
    choices = [dict(c) for c in itertools.product(*[[(grp, v) for v in vals] for grp, vals in p.options])]
    assert best_score(p, g) == max(get_reward(p, g, c).score for c in choices)
    # "8 fl oz" matches 2 and 4 fl oz (86) but not 16 fl oz (80): every goal option can be met
    assert matching_values(p, g) == {"scent": frozenset({"citrus"}), "size": frozenset({"2 fl oz", "4 fl oz"})}
    assert best_score(p, g) == 1.0


def test_price_upper_follows_webshop_grid():
    rng = random.Random(0)
    for price in (3.0, 19.99, 47.5, 333.0):
        ups = {price_upper(price, rng) for _ in range(50)}
        grid = [10.0 * i for i in range(1, 100) if 10.0 * i > price][:4]
        assert ups <= set(grid[1:]) and all(u > price for u in ups)


def tagger():
    """A real spaCy pipeline whose attribute_ruler tags a few words as NOUN / PROPN (no trained model)."""
    spacy = pytest.importorskip("spacy")
    nlp = spacy.blank("en")
    ruler = nlp.add_pipe("attribute_ruler")
    for words, pos in ((("Moisturizer", "Face", "Shirt"), "NOUN"), (("Aurora", "Cobalt"), "PROPN")):
        for w in words:
            ruler.add([[{"ORTH": w}]], {"POS": pos})
    return nlp


def test_spacy_title_nouns_keep_repeats_lower_cased():
    assert title_nouns(tagger(), ["Aurora Face Moisturizer Face", "Cobalt Oil Free"]) == \
        [("aurora", "face", "moisturizer", "face"), ("cobalt",)]


def test_spacy_type_nouns_replace_catalogue_nouns():
    cfg = WebshopConfig(num_products=140, type_nouns="spacy")
    nlp = tagger()
    cat = generate_catalogue(cfg, nlp=nlp)
    base = generate_catalogue(WebshopConfig(num_products=140))
    assert [p.title for p in cat.products] == [p.title for p in base.products]
    assert [p.nouns for p in cat.products] == title_nouns(nlp, [p.title for p in base.products])
    assert any(p.nouns != q.nouns for p, q in zip(cat.products, base.products))


def test_spacy_model_missing_is_one_clear_error():
    spacy = pytest.importorskip("spacy")
    try:
        spacy.load(catalogue.SPACY_MODEL)
    except OSError:
        with pytest.raises(EnvError, match=r"needs the spaCy model en_core_web_sm .*type_nouns = 'catalogue'"):
            load_spacy_english()
    else:
        assert load_spacy_english() is not None
    with pytest.raises(EnvError, match="type_nouns"):
        WebshopConfig(type_nouns="nltk")
