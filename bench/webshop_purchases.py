"""What WebShop policies buy: why success stays low while the score given a purchase rises.

For every run of a store (``--runs-dir``), its first and last evaluation on each split are
read back from SQLite and each purchase is checked against the episode's goal, rebuilt from the
run's stored config: the goal product itself, all goal attributes on the bought product, price under
the limit, and the options. An option group is *answerable* when the bought product offers the
goal's value; on answerable groups the policy's last click is compared with the goal value and
with chance (1 / number of values). Writes ``bench/results/webshop_purchases_<label>.md`` / ``.json``.

    .venv/bin/python bench/webshop_purchases.py --runs-dir runs/learning-webshop-v3-lr1e-3 --label v3-lr1e-3
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from milegpo_cli.config import Config
from milegpo_cli.store import RunStore
from milegpo_cli.trainer.builders import build_suite

ROOT = Path(__file__).resolve().parents[1]


def purchase_counts(suite, tasks: dict, episodes: list[dict], steps_of) -> Counter:
    """Counts over one evaluation's episodes (see the module docstring)."""
    c = Counter()
    for e in episodes:
        goal = suite.context(tasks[e["task_id"]]).goal
        clicks = [a[len("click["):-1] for a in steps_of(e["id"]) if a.startswith("click[")]
        c["episodes"] += 1
        c["success"] += bool(e["success"])
        product = next((suite.catalogue.by_asin[a.upper()] for a in clicks if a.upper() in suite.catalogue.by_asin), None)
        if product is None or "buy now" not in clicks:
            continue
        c["bought"] += 1
        c["goal_product"] += product.asin == goal.asin
        c["attributes_all"] += set(goal.attributes) <= set(product.attributes)
        c["price_ok"] += product.price <= goal.price_upper
        wanted = dict(goal.options)
        for group, values in product.options:
            values = [v.lower() for v in values]
            want = (wanted.get(group) or "").lower()
            if want not in values:
                continue
            c["answerable_groups"] += 1
            chosen = [a for a in clicks if a in values]
            if not chosen:
                c["answerable_skipped"] += 1
                continue
            c["answerable_clicked"] += 1
            c["option_right"] += chosen[-1] == want
            c["option_chance"] += 1 / len(values)
    return c


def rates(c: Counter) -> dict:
    bought, clicked = max(c["bought"], 1), max(c["answerable_clicked"], 1)
    return {"episodes": c["episodes"], "success": c["success"] / max(c["episodes"], 1), "bought": c["bought"],
            "goal_product": c["goal_product"] / bought, "attributes_all": c["attributes_all"] / bought,
            "price_ok": c["price_ok"] / bought, "answerable_groups": c["answerable_groups"],
            "answerable_skipped": c["answerable_skipped"] / max(c["answerable_groups"], 1),
            "option_right": c["option_right"] / clicked, "option_chance": c["option_chance"] / clicked}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs-dir", type=Path, required=True)
    ap.add_argument("--label", required=True)
    args = ap.parse_args()
    store = RunStore(f"sqlite:///{args.runs_dir / 'milegpo.db'}")
    rows = []
    for run in store.list_runs():
        config = Config.from_dict(run["config"])
        suite = build_suite(config)
        evals = store.evaluations(run["id"])
        for split in config.eval.splits:
            tasks = {t.task_id: t for t in suite.tasks(split, suite.split_size(split))}
            mine = sorted((ev for ev in evals if ev["split"] == split), key=lambda ev: ev["iteration"])
            for ev in {e["id"]: e for e in (mine[:1] + mine[-1:])}.values():  # first and last (once if equal)
                eps = store.episodes(run["id"], evaluation_id=ev["id"])
                by_episode: dict[int, list[str]] = {}
                for s in store.steps(run["id"], evaluation_id=ev["id"]):
                    by_episode.setdefault(s["episode_id"], []).append(s["action"])
                c = purchase_counts(suite, tasks, eps, lambda eid: by_episode.get(eid, []))
                rows.append({"run": run["id"], "seed": run["seed"], "split": split, "iteration": ev["iteration"],
                             **rates(c)})
    out = ROOT / "bench" / "results" / f"webshop_purchases_{args.label}"
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    cols = ["run", "seed", "split", "iteration", "episodes", "success", "bought", "goal_product", "attributes_all",
            "price_ok", "answerable_groups", "answerable_skipped", "option_right", "option_chance"]
    lines = [f"What the WebShop policies of `{args.runs_dir.name}` bought, first and last evaluation "
             "(bench/webshop_purchases.py; shares of purchases, options on answerable groups)", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(f"{r[k]:.3f}" if isinstance(r[k], float) else str(r[k]) for k in cols) + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
