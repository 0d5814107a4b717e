"""Agreement of envs/webshop/reward.py with the original WebShop reward, side by side (issue 16).

    python bench/webshop_reward_agreement.py UPSTREAM [--thefuzz DIR] [--seed 11] [--tasks 600]

UPSTREAM is a checkout of princeton-nlp/WebShop: only its web_agent_site/engine/goal.py and
normalize.py are loaded from there. spaCy is replaced by a stub that tags every word of the name it
is given as a noun, and each product's (and goal's) name is its catalogue nouns, so both sides use
the same type nouns and only the rules differ. ``--thefuzz DIR`` runs the original with the thefuzz
found in DIR (e.g. ``pip install --target DIR thefuzz==0.19.0``, the original's pin); by default
both sides use the installed thefuzz.

Cases come from a fresh simulator (``--seed``, 5,000 products, ``--tasks`` train/id/ood goals):
natural ones (the oracle's purchase, the goal product with random options, a search result and a
same-type product with random options) and perturbed ones (wrong options, over budget and price
limits <= 0, wrong category or attributes, empty strings, non-ASCII text). Goal options are given
to the original as a list of values (its human-goal form); the JSON also counts agreement with its
synthetic-goal form (a dict, whose items it compares as stringified (group, value) pairs).
Writes bench/results/webshop_reward_agreement.json: per kind the cases, agreements and cases where
the original raises, and the first disagreements.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import random
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from envs.webshop import reward  # noqa: E402  (binds the installed thefuzz before any swap)
from envs.webshop.catalogue import CATEGORIES, Product  # noqa: E402
from envs.webshop.config import WebshopConfig  # noqa: E402
from envs.webshop.goals import Goal  # noqa: E402
from envs.webshop.suite import WebshopSuite  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "webshop_reward_agreement.json")
ACCENTS = {"a": "àáâä", "e": "èéêë", "i": "ìíîï", "o": "òóôö", "u": "ùúûü", "n": "ñ", "c": "ç"}
BEYOND_LATIN1 = ("ł", "œ", "ő", "ş", "α", "ж", "ﬁ", "—", "™", "😀")
POOLS = sorted({(g, vals) for _, _, subs in CATEGORIES.values() for ts in subs.values() for t in ts
                for g, vals in t.options})
ALL_ATTRIBUTES = sorted({a for _, attrs, _ in CATEGORIES.values() for a in attrs})


def load_original(upstream: str, thefuzz_dir: str | None):
    """goal.get_reward of the upstream checkout, with spaCy stubbed (see the module docstring)."""
    engine = os.path.join(upstream, "web_agent_site", "engine")

    class Token:
        def __init__(self, text: str) -> None:
            self.text, self.pos_ = text, "NOUN"

    swapped = ("spacy", "thefuzz", "thefuzz.fuzz", "thefuzz.utils", "thefuzz.process", "thefuzz.string_processing")
    saved = {k: sys.modules.get(k) for k in swapped}
    sys.modules["spacy"] = types.SimpleNamespace(load=lambda name: lambda text: [Token(w) for w in text.split()])
    if thefuzz_dir:
        for k in swapped[1:]:
            sys.modules.pop(k, None)
        sys.path.insert(0, thefuzz_dir)
    for pkg in ("web_agent_site", "web_agent_site.engine"):
        sys.modules.setdefault(pkg, types.ModuleType(pkg))
    mods = {}
    for name in ("normalize", "goal"):
        spec = importlib.util.spec_from_file_location(f"web_agent_site.engine.{name}", os.path.join(engine, f"{name}.py"))
        mods[name] = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mods[name]
        spec.loader.exec_module(mods[name])
    fuzz_version = getattr(sys.modules["thefuzz"], "__version__", "?")
    for k, v in saved.items():  # the original keeps its references; the rest of this process is unaffected
        if v is None:
            sys.modules.pop(k, None)
        else:
            sys.modules[k] = v
    if thefuzz_dir:
        sys.path.remove(thefuzz_dir)
    return mods["goal"].get_reward, fuzz_version


def original_score(get_reward, p: Product, g: Goal, options: dict[str, str], as_dict: bool) -> float:
    product = {"query": p.query, "product_category": p.product_category, "name": " ".join(p.nouns),
               "Attributes": list(p.attributes), "Title": p.title, "BulletPoints": list(p.features),
               "Description": p.description}
    goal_options = dict(g.options) if as_dict else [v for _, v in g.options]
    goal = {"query": g.query, "product_category": g.product_category, "name": " ".join(g.nouns),
            "attributes": list(g.attributes), "price_upper": g.price_upper, "goal_options": goal_options}
    return float(get_reward(product, goal, price=p.price, options=dict(options)))


def random_options(p: Product, rng: random.Random) -> dict[str, str]:
    return {grp: rng.choice(vals) for grp, vals in p.options if rng.random() > 0.15}


def natural_cases(suite: WebshopSuite, tasks, rng: random.Random):
    cat = suite.catalogue
    for t in tasks:
        ctx = suite.context(t)
        goal, oracle = ctx.goal, ctx.oracle
        i = rng.choice(sorted(oracle.good))
        yield "oracle_purchase", cat.products[i], goal, {g: rng.choice(sorted(v)) for g, v in oracle.good[i].items()}
        gp = cat.by_asin[goal.asin]
        yield "goal_product_random_options", gp, goal, random_options(gp, rng)
        hits = suite.site.engine.search(rng.choice(ctx.queries))
        p = cat.products[rng.choice(hits)] if hits else gp
        yield "search_result_random_options", p, goal, random_options(p, rng)
        same = [q for q in cat.products if q.query == goal.query]
        p = rng.choice(same)
        yield "same_type_random_options", p, goal, random_options(p, rng)


def accent(s: str, rng: random.Random) -> str:
    out = [rng.choice(ACCENTS[c]) if c in ACCENTS and rng.random() < 0.4 else c for c in s]
    if rng.random() < 0.4:
        out.insert(rng.randrange(len(out) + 1), rng.choice(BEYOND_LATIN1))
    return "".join(out)


def typo(s: str, rng: random.Random) -> str:
    if not s:
        return s
    k = rng.randrange(len(s))
    return rng.choice((s[:k] + s[k + 1:], s[:k] + s[k] + s[k:], s + "s", s.upper(), s.replace(" ", "-")))


def perturb(p: Product, g: Goal, opts: dict[str, str], kind: str, rng: random.Random, cat):
    """One perturbed case of ``kind`` from a natural (product, goal, options)."""
    rep = dataclasses.replace
    if kind == "wrong_options":
        new = {}
        for grp, v in list(opts.items()) or [(grp, vals[0]) for grp, vals in p.options]:
            how = rng.randrange(5)
            if how == 0:  # another value of the same pool
                pool = next(vals for gg, vals in POOLS if gg == grp and v in vals)
                new[grp] = rng.choice(pool)
            elif how == 1:  # a value of any pool
                new[grp] = rng.choice(rng.choice(POOLS)[1])
            elif how == 2:  # compound colour words
                new[grp] = rng.choice(("dark {}", "light {}", "{} blue", "navy {}", "{} stone")).format(v)
            elif how == 3:  # the size-like suffixes of WebShop's catalogue
                new[grp] = rng.choice(("{} pack", "x-{}", "{} (pack of 2)", "{}-inch", "one size")).format(v)
            else:
                new[grp] = typo(v, rng)
        if rng.random() < 0.3:  # the goal's options perturbed instead
            return p, rep(g, options=tuple((grp, new.get(grp, v)) for grp, v in g.options)), opts
        return p, g, new
    if kind == "over_budget":
        limit = rng.choice((p.price - 0.01, max(10.0, 10.0 * int(p.price // 10)), 0.0, -10.0, p.price))
        return p, rep(g, price_upper=limit), opts
    if kind == "wrong_category":
        other = rng.choice(cat.products)
        how = rng.randrange(3)
        if how == 0:
            return other, g, random_options(other, rng)
        if how == 1:
            return p, rep(g, product_category=other.product_category, query=other.query), opts
        return p, rep(g, nouns=other.nouns + g.nouns[:rng.randrange(len(g.nouns) + 1)]), opts
    if kind == "wrong_attributes":
        how = rng.randrange(4)
        attrs = list(g.attributes)
        if how == 0:
            attrs[rng.randrange(len(attrs))] = rng.choice(ALL_ATTRIBUTES)
        elif how == 1:
            attrs = [typo(a, rng) for a in attrs]
        elif how == 2:  # a phrase spanning the title and the bullet points
            attrs.append(f"{p.title.lower().split()[-1]} {p.features[0].lower().split()[0]}")
        else:
            attrs.append(" ".join(p.description.lower().split()[2:4]))
        return p, rep(g, attributes=tuple(attrs)), opts
    if kind == "empty":
        how = rng.randrange(6)
        if how == 0:
            return p, rep(g, attributes=g.attributes + ("",)), opts
        if how == 1:
            return p, g, {**opts, p.options[0][0]: ""}
        if how == 2:
            return rep(p, description="", features=("",)), g, opts
        if how == 3:
            return rep(p, attributes=()), g, opts
        if how == 4:
            return p, rep(g, options=g.options + (("style", ""),)), opts
        return rep(p, nouns=()), rep(g, nouns=()), opts
    if kind == "non_ascii":
        how = rng.randrange(4)
        if how == 0:
            return p, rep(g, attributes=tuple(accent(a, rng) for a in g.attributes)), opts
        if how == 1:
            return rep(p, attributes=tuple(accent(a, rng) for a in p.attributes)), g, opts
        if how == 2:
            return p, g, {k: accent(v, rng) for k, v in opts.items()}
        return p, rep(g, options=tuple((k, accent(v, rng)) for k, v in g.options)), opts
    raise ValueError(kind)


PERTURBATIONS = ("wrong_options", "over_budget", "wrong_category", "wrong_attributes", "empty", "non_ascii")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("upstream", help="checkout of princeton-nlp/WebShop")
    ap.add_argument("--thefuzz", default=None, help="folder with the thefuzz for the original's side")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--tasks", type=int, default=600, help="goals: a third each from train, id, ood")
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args()
    get_original, fuzz_version = load_original(args.upstream, args.thefuzz)
    suite = WebshopSuite(WebshopConfig(seed=args.seed))
    k = args.tasks // 3
    tasks = suite.tasks("train", k, seed=args.seed) + suite.tasks("id", k, seed=args.seed) + \
        suite.tasks("ood", args.tasks - 2 * k, seed=args.seed)
    rng = random.Random(f"agreement-{args.seed}")
    natural = list(natural_cases(suite, tasks, rng))
    perturbed = [(kind, *perturb(p, g, o, kind, rng, suite.catalogue))
                 for _, p, g, o in natural for kind in rng.sample(PERTURBATIONS, 2)]
    per_kind: dict[str, dict] = {}
    for family, cases in (("natural", natural), ("perturbed", perturbed)):
        for kind, p, g, opts in cases:
            row = per_kind.setdefault(kind, {"family": family, "cases": 0, "agree": 0, "original_raises": 0,
                                             "agree_dict_form": 0, "disagreements": []})
            row["cases"] += 1
            ours = reward.get_reward(p, g, opts).score
            try:
                theirs = original_score(get_original, p, g, opts, as_dict=False)
            except (TypeError, ZeroDivisionError) as e:
                row["original_raises"] += 1
                row.setdefault("raise_examples", []).append(f"{type(e).__name__}: {e}")
                continue
            if abs(ours - theirs) < 1e-9:
                row["agree"] += 1
            elif len(row["disagreements"]) < 20:
                row["disagreements"].append({"ours": ours, "original": theirs, "asin": p.asin, "options": opts,
                                             "goal": {**g.to_payload(), "instruction": None},
                                             "product_attributes": list(p.attributes), "title": p.title})
            row["agree_dict_form"] += abs(ours - original_score(get_original, p, g, opts, as_dict=True)) < 1e-9
    summary = {}
    for family in ("natural", "perturbed"):
        rows = [r for r in per_kind.values() if r["family"] == family]
        n = sum(r["cases"] for r in rows)
        raised = sum(r["original_raises"] for r in rows)
        agree = sum(r["agree"] for r in rows)
        dict_agree = sum(r["agree_dict_form"] for r in rows)
        summary[family] = {"cases": n, "original_raises": raised, "compared": n - raised, "agree": agree,
                           "agreement": agree / max(1, n - raised),
                           "agreement_dict_goal_options": dict_agree / max(1, n - raised)}
    for r in per_kind.values():
        r["raise_examples"] = sorted(set(r.get("raise_examples", [])))[:3]
    out = {"command": " ".join(sys.argv), "seed": args.seed, "tasks": len(tasks),
           "thefuzz_original": fuzz_version, "summary": summary, "per_kind": per_kind}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
    for family, s in summary.items():
        print(f"{family}: {s['agree']}/{s['compared']} agree ({100 * s['agreement']:.2f} %), "
              f"{s['original_raises']} where the original raises; dict-form goal options "
              f"{100 * s['agreement_dict_goal_options']:.2f} %")
    for kind, r in per_kind.items():
        print(f"  {kind}: {r['agree']}/{r['cases'] - r['original_raises']} (+{r['original_raises']} raise)")


if __name__ == "__main__":
    main()
