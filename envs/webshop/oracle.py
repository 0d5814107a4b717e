"""Oracle for one task: the best-possible purchases and shortest plans towards them.

A product is *good* when its best score (reward.best_score) equals the best over the catalogue
(only products sharing a type noun with the goal can score above 0). ``distance(state)`` is the
fewest steps from ``state`` to buying a good product with matching options, over the admissible
actions (search page: the offered queries); oracle actions are the admissible actions whose
successor is one step closer. Subgoals: "searched" (results contain a good product), "opened_goal"
(a good product's page), "options_chosen" (a good product with every matchable group matched),
"bought" (a best-possible purchase). Any matching value per matchable group gives the best score:
values of different option groups never match each other (tests/test_webshop_reward.py checks the
catalogue's pools), so each group can only match the goal's option of the same group.
"""
from __future__ import annotations

import math

from envs.webshop.goals import Goal
from envs.webshop.pages import PageState, Site
from envs.webshop.reward import best_score, matching_values

SCORE_EPS = 1e-9


class TaskOracle:
    def __init__(self, site: Site, goal: Goal, queries: tuple[str, ...]) -> None:
        self.site = site
        self.goal = goal
        self.queries = queries
        cat = site.catalogue
        scores = {i: best_score(cat.products[i], goal) for i in cat.sharing_nouns(goal.nouns)}
        self.best = max(scores.values(), default=0.0)
        self.good: dict[int, dict[str, frozenset[str]]] = {
            i: matching_values(cat.products[i], goal) for i, s in scores.items()
            if self.best > 0 and s >= self.best - SCORE_EPS}
        self._results: dict[tuple[str, int], float] = {}
        self.search_distance = min((1 + self._results_distance(q, 1, math.inf) for q in queries), default=math.inf)

    def missing_options(self, state: PageState) -> int:
        chosen = dict(state.options)
        return sum(1 for g, ok in self.good[state.item].items() if chosen.get(g) not in ok)

    def _results_distance(self, query: str, page_no: int, via_search: float) -> float:
        key = (query, page_no)
        if key not in self._results:
            best = math.inf
            for pos, i in enumerate(self.site.engine.search(query)):
                if i in self.good:
                    page = pos // self.site.rpp + 1
                    best = min(best, abs(page - page_no) + 1 + len(self.good[i]) + 1)
            self._results[key] = best
        return min(self._results[key], 1 + via_search)

    def distance(self, state: PageState) -> float:
        """Fewest steps to a best-possible purchase from ``state`` (inf when none is reachable)."""
        page = state.page
        if page == "search":
            return self.search_distance
        if page == "done":
            return math.inf
        if page == "results":
            return self._results_distance(state.query, state.page_no, self.search_distance)
        if page == "item":
            here = self.missing_options(state) + 1 if state.item in self.good else math.inf
            prev = 1 + self._results_distance(state.query, state.page_no, self.search_distance)
            return min(here, prev, 1 + self.search_distance)
        item = PageState("item", state.query, state.page_no, state.item, state.options)
        return 1 + min(self.distance(item), self.search_distance)

    def actions(self, state: PageState, admissible: tuple[str, ...]) -> tuple[str, ...]:
        """Admissible actions on a shortest plan to a best-possible purchase."""
        d = self.distance(state)
        if math.isinf(d):
            return ()
        out = []
        for a in admissible:
            nxt = self.site.transition(state, a)
            if nxt is None:
                continue
            if nxt.page == "done":
                if self.is_best_purchase(nxt):
                    out.append(a)
            elif 1 + self.distance(nxt) == d:
                out.append(a)
        return tuple(out)

    def is_best_purchase(self, state: PageState) -> bool:
        return state.item in self.good and self.missing_options(state) == 0

    def subgoals(self, before: PageState, after: PageState) -> list[str]:
        """True subgoals holding in ``after`` (the caller keeps those newly reached)."""
        out = []
        if before.page == "search" and after.page == "results":
            if any(i in self.good for i in self.site.engine.search(after.query)):
                out.append("searched")
        if after.item in self.good and after.page != "search" and after.page != "results":
            if after.page != "done":
                out.append("opened_goal")
            if self.missing_options(after) == 0:
                out.append("options_chosen")
            if after.page == "done":
                out.append("bought")
        return out
