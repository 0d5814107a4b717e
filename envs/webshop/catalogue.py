"""A seeded product catalogue in the shape of WebShop's crawled Amazon products.

Each product has an ASIN-like id, a title, a breadcrumb ``product_category``, the crawl ``query``
(its product type), attributes, bullet points (features), a description, option groups
(size, colour, scent, ...) and one price. The reward's type match compares the nouns of titles:
WebShop takes them from spaCy POS tags; here ``type_nouns = "catalogue"`` (default) gives each
product its type's declared nouns, ``"spacy"`` the nouns spaCy's ``en_core_web_sm`` tags in its title.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, replace

from envs.base import EnvError
from envs.webshop.config import WebshopConfig

SPACY_MODEL = "en_core_web_sm"  # the model WebShop's goal.py loads

# option value pools (group name, values); values of different groups share no token
APPAREL = ("size", ("x-small", "small", "medium", "large", "x-large", "xx-large"))
SHOE = ("size", ("6", "7", "8", "9", "10", "11", "12"))
FLOZ = ("size", ("2 fl oz", "4 fl oz", "8 fl oz", "16 fl oz"))
COUNT = ("size", ("6 count", "12 count", "24 count", "48 count"))
OUNCE = ("size", ("8 ounce", "12 ounce", "16 ounce", "32 ounce"))
BED = ("size", ("twin", "full", "queen", "king"))
FEET = ("size", ("25 ft", "50 ft", "75 ft", "100 ft"))
INCH = ("size", ("8 inch", "10 inch", "12 inch", "14 inch"))
POUND = ("size", ("5 pound", "10 pound", "15 pound", "20 pound"))
MM = ("size", ("4mm", "6mm", "8mm", "10mm"))
OZ = ("size", ("12 oz", "20 oz", "32 oz", "40 oz"))
PERSON = ("size", ("1 person", "2 person", "4 person", "6 person"))
COLOR = ("color", ("black", "white", "navy", "grey", "green", "pink", "beige", "brown", "purple", "teal"))
SCENT = ("scent", ("lavender", "citrus", "vanilla", "unscented", "eucalyptus", "coconut", "jasmine"))
FLAVOR = ("flavor", ("chocolate", "strawberry", "peanut butter", "sea salt", "mango", "cinnamon", "lemon"))
STYLE = ("style", ("standard", "deluxe", "premium", "basic"))


@dataclass(frozen=True)
class ProductType:
    phrase: str  # e.g. "face moisturizer" (also the crawl query)
    nouns: tuple[str, ...]  # the nouns of the phrase, used by the type reward
    options: tuple[tuple[str, tuple[str, ...]], ...]
    price: tuple[float, float]


def _t(phrase: str, nouns: str, options: tuple, price: tuple[float, float]) -> ProductType:
    return ProductType(phrase, tuple(nouns.split()), options, price)


# category -> (breadcrumb root, attribute pool, {subcategory: [types]})
CATEGORIES: dict[str, tuple[str, tuple[str, ...], dict[str, list[ProductType]]]] = {
    "beauty": ("Beauty & Personal Care", (
        "long lasting", "sensitive skin", "paraben free", "cruelty free", "alcohol free", "travel size",
        "natural ingredients", "dry skin", "oil free", "dermatologist tested", "fragrance free", "vitamin c"), {
        "Skin Care": [_t("face moisturizer", "face moisturizer", (SCENT, FLOZ), (8, 45)),
                      _t("face wash", "face wash", (SCENT, FLOZ), (6, 30)),
                      _t("body lotion", "body lotion", (SCENT, FLOZ), (5, 28))],
        "Hair Care": [_t("shampoo", "shampoo", (SCENT, FLOZ), (6, 35)),
                      _t("conditioner", "conditioner", (SCENT, FLOZ), (6, 35)),
                      _t("hair oil", "hair oil", (SCENT, FLOZ), (9, 40))]}),
    "electronics": ("Electronics", (
        "noise cancelling", "fast charging", "long battery life", "water resistant", "easy to carry",
        "usb c", "plug and play", "lightweight", "ergonomic design", "high fidelity", "hands free",
        "wireless connection"), {
        "Audio": [_t("wireless earbuds", "earbuds", (COLOR, STYLE), (20, 180)),
                  _t("bluetooth speaker", "bluetooth speaker", (COLOR, STYLE), (25, 200)),
                  _t("over ear headphones", "ear headphones", (COLOR, STYLE), (30, 300))],
        "Computer Accessories": [_t("usb hub", "usb hub", (COLOR,), (12, 60)),
                                 _t("wireless mouse", "mouse", (COLOR,), (10, 70)),
                                 _t("laptop stand", "laptop stand", (COLOR, STYLE), (18, 90))]}),
    "fashion": ("Clothing, Shoes & Jewelry", (
        "machine wash", "slim fit", "relaxed fit", "quick drying", "breathable material", "non slip",
        "rubber sole", "lace up", "moisture wicking", "button closure", "elastic waist", "soft fabric"), {
        "Clothing": [_t("t-shirt", "shirt", (COLOR, APPAREL), (9, 40)),
                     _t("hoodie", "hoodie", (COLOR, APPAREL), (20, 70)),
                     _t("jogger pants", "jogger pants", (COLOR, APPAREL), (18, 60))],
        "Shoes": [_t("running shoes", "shoes", (COLOR, SHOE), (35, 160)),
                  _t("walking shoes", "shoes", (COLOR, SHOE), (30, 140)),
                  _t("ankle boots", "ankle boots", (COLOR, SHOE), (40, 190))]}),
    "grocery": ("Grocery & Gourmet Food", (
        "gluten free", "low sugar", "non gmo", "high protein", "keto friendly", "usda organic",
        "individually wrapped", "dairy free", "plant based", "low calorie", "kosher certified", "no preservatives"), {
        "Snacks": [_t("protein bars", "protein bars", (FLAVOR, COUNT), (12, 45)),
                   _t("granola", "granola", (FLAVOR, OUNCE), (5, 25)),
                   _t("trail mix", "trail mix", (FLAVOR, OUNCE), (6, 30))],
        "Beverages": [_t("green tea", "tea", (FLAVOR, COUNT), (5, 30)),
                      _t("coffee beans", "coffee beans", (FLAVOR, OUNCE), (9, 45)),
                      _t("sparkling water", "water", (FLAVOR, COUNT), (8, 35))]}),
    "garden": ("Patio, Lawn & Garden", (
        "weather resistant", "rust proof", "heavy duty", "easy to install", "uv protection", "eco friendly",
        "stainless steel", "easy to assemble", "frost resistant", "solar powered", "leak free", "ergonomic handle"), {
        "Gardening": [_t("garden hose", "garden hose", (COLOR, FEET), (20, 90)),
                      _t("pruning shears", "shears", (COLOR, STYLE), (10, 45)),
                      _t("plant pots", "plant pots", (COLOR, INCH), (12, 60))],
        "Outdoor Decor": [_t("solar lights", "lights", (COLOR, COUNT), (15, 70)),
                          _t("bird feeder", "bird feeder", (COLOR, STYLE), (12, 55)),
                          _t("patio umbrella", "patio umbrella", (COLOR, FEET), (40, 220))]}),
    "home_kitchen": ("Home & Kitchen", (
        "dishwasher safe", "non stick", "bpa free", "easy to clean", "microwave safe", "machine washable",
        "super soft", "wrinkle free", "heat resistant", "space saving", "long handle", "oven safe"), {
        "Kitchen & Dining": [_t("coffee mug", "coffee mug", (COLOR, OZ), (8, 35)),
                             _t("cutting board", "cutting board", (COLOR, INCH), (12, 60)),
                             _t("frying pan", "frying pan", (COLOR, INCH), (20, 120))],
        "Bedding": [_t("bed sheets", "bed sheets", (COLOR, BED), (20, 110)),
                    _t("duvet cover", "duvet cover", (COLOR, BED), (25, 130)),
                    _t("throw pillow covers", "throw pillow covers", (COLOR, INCH), (8, 40))]}),
    "sports": ("Sports & Outdoors", (
        "non slip", "extra thick", "lightweight", "portable", "high density", "durable construction",
        "easy to carry", "leak proof", "double wall insulated", "quick setup", "adjustable strap", "anti tear"), {
        "Fitness": [_t("yoga mat", "yoga mat", (COLOR, MM), (15, 80)),
                    _t("resistance bands", "resistance bands", (COLOR, STYLE), (8, 40)),
                    _t("dumbbells", "dumbbells", (COLOR, POUND), (20, 150))],
        "Outdoor Recreation": [_t("water bottle", "water bottle", (COLOR, OZ), (10, 45)),
                               _t("camping tent", "camping tent", (COLOR, PERSON), (45, 300)),
                               _t("hiking backpack", "hiking backpack", (COLOR, STYLE), (30, 160))]}),
}

BRANDS = ("Aurora", "Bellwood", "Cobalt", "Dunmore", "Everly", "Fernhill", "Glenrock", "Harlow", "Ivory Oak",
          "Juniper", "Kestrel", "Larkspur", "Meridian", "Northwind", "Oakhaven", "Pinecrest", "Quill",
          "Ridgeway", "Sable", "Thornbury", "Umber", "Vantage", "Willow", "Yarrow", "Zephyr")
TITLE_SUFFIX = ("", " for Daily Use", " - New Edition", " - Gift Idea", " for Home and Travel")
FEATURE_TEMPLATES = ("{a}: thoroughly tested by our team", "{a}, as promised on the label",
                     "{a} and backed by our guarantee", "Enjoy the {a} benefit every day")
DESCRIPTION_TEMPLATE = ("The {brand} {phrase} is part of our {sub} collection. "
                        "Customers choose it because it is {a}.")
ASIN_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


@dataclass(frozen=True)
class Product:
    idx: int
    asin: str
    category: str  # top-level category key, e.g. "beauty" (the split unit)
    product_category: str  # breadcrumb "Beauty & Personal Care › Skin Care › Face Moisturizer"
    query: str  # the crawl query: the product type phrase
    nouns: tuple[str, ...]  # title nouns for the type reward (repeats kept, as spaCy's list)
    title: str
    attributes: tuple[str, ...]
    features: tuple[str, ...]  # WebShop's BulletPoints
    description: str
    options: tuple[tuple[str, tuple[str, ...]], ...]  # (group, values) in display order
    price: float

    @property
    def price_tag(self) -> str:
        return f"${self.price:.2f}"


@dataclass(frozen=True)
class Catalogue:
    products: tuple[Product, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_asin", {p.asin: p for p in self.products})
        by_noun: dict[str, list[int]] = {}
        for p in self.products:
            for n in set(p.nouns):
                by_noun.setdefault(n, []).append(p.idx)
        object.__setattr__(self, "by_noun", {k: tuple(v) for k, v in by_noun.items()})

    def sharing_nouns(self, nouns: tuple[str, ...]) -> tuple[int, ...]:
        """Products whose type shares a noun with ``nouns`` (the only ones with a type reward > 0)."""
        return tuple(sorted({i for n in nouns for i in self.by_noun.get(n, ())}))


def types_of(category: str) -> list[tuple[str, ProductType]]:
    """(subcategory, type) pairs of a top-level category."""
    return [(sub, t) for sub, ts in CATEGORIES[category][2].items() for t in ts]


def _asin(rng: random.Random, used: set[str]) -> str:
    while True:
        asin = "B0" + "".join(rng.choice(ASIN_CHARS) for _ in range(8))
        if asin not in used:
            used.add(asin)
            return asin


def _product(rng: random.Random, idx: int, asin: str, category: str) -> Product:
    root, pool, _ = CATEGORIES[category]
    sub, ptype = rng.choice(types_of(category))
    brand = rng.choice(BRANDS)
    attributes = tuple(rng.sample(pool, rng.randint(3, 5)))
    in_title = attributes[: rng.randint(1, 2)]
    title = f"{brand} {' '.join(a.title() for a in in_title)} {ptype.phrase.title()}{rng.choice(TITLE_SUFFIX)}"
    features = tuple(rng.choice(FEATURE_TEMPLATES).format(a=a).capitalize() for a in attributes)
    description = DESCRIPTION_TEMPLATE.format(brand=brand, phrase=ptype.phrase, sub=sub.lower(),
                                              a=rng.choice(attributes))
    options = []
    for group, values in ptype.options:
        chosen = sorted(rng.sample(values, rng.randint(2, min(5, len(values)))), key=values.index)
        options.append((group, tuple(chosen)))
    lo, hi = ptype.price
    price = round(max(1.0, round(rng.uniform(lo, hi)) - 0.01), 2)
    return Product(idx, asin, category, f"{root} › {sub} › {ptype.phrase.title()}", ptype.phrase,
                   ptype.nouns, title, attributes, features, description, tuple(options), price)


def title_nouns(nlp, titles: list[str]) -> list[tuple[str, ...]]:
    """Per title, its lower-cased tokens that ``nlp`` tags NOUN or PROPN, repeats kept (goal.py get_type_reward)."""
    return [tuple(t.text.lower() for t in doc if t.pos_ in ("NOUN", "PROPN")) for doc in nlp.pipe(titles)]


def load_spacy_english():
    """spaCy's ``en_core_web_sm`` pipeline, or an EnvError naming what to install."""
    try:
        import spacy
    except ImportError:
        raise EnvError("type_nouns = 'spacy' needs spaCy: pip install spacy") from None
    try:
        return spacy.load(SPACY_MODEL)
    except OSError:
        raise EnvError(f"type_nouns = 'spacy' needs the spaCy model {SPACY_MODEL} "
                       f"(python -m spacy download {SPACY_MODEL}); or use type_nouns = 'catalogue'") from None


def generate_catalogue(config: WebshopConfig, nlp=None) -> Catalogue:
    """``config.num_products`` products spread evenly over ``config.categories`` (seeded). With
    ``type_nouns = "spacy"`` their nouns are ``title_nouns`` of the titles (``nlp``: default en_core_web_sm)."""
    rng = random.Random(f"webshop-catalogue-{config.seed}")
    used: set[str] = set()
    cats = config.categories
    products = tuple(_product(rng, i, _asin(rng, used), cats[i % len(cats)]) for i in range(config.num_products))
    if config.type_nouns == "spacy":
        nouns = title_nouns(nlp or load_spacy_english(), [p.title for p in products])
        products = tuple(replace(p, nouns=n) for p, n in zip(products, nouns))
    return Catalogue(products)
