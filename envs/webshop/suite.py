"""The WebShop simulator as an EnvSuite: catalogue + BM25 search + pages + reward + oracle.

A fault inside one episode's step (an exception, or a step running past ``step_timeout_s``) ends
that episode only: its StepResult carries the traceback in ``error`` and its state is dropped; the
other episodes of the batch go on (docs/reliability.md).
"""
from __future__ import annotations

import contextlib
import random
import signal
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from envs.base import EnvError, EnvSuite, Observation, StepResult, Task, VectorEnv
from envs.faults import fault_point
from envs.webshop.catalogue import CATEGORIES, generate_catalogue
from envs.webshop.config import WebshopConfig
from envs.webshop.goals import Goal, candidate_queries, make_goal
from envs.webshop.oracle import SCORE_EPS, TaskOracle
from envs.webshop.pages import BACK, BUY, NEXT, PREV, SEARCH_PAGE, PageState, Site
from envs.webshop.reward import get_reward
from envs.webshop.search import SearchEngine

SPLITS = ("train", "id", "ood")
_CONTEXT_CACHE = 4096


class StepTimeout(TimeoutError):
    """A step ran past ``step_timeout_s``."""


@contextlib.contextmanager
def step_deadline(seconds: float):
    """Raise StepTimeout in this block after ``seconds`` (SIGALRM: main thread only; 0 = no limit)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(_signum, _frame):
        raise StepTimeout(f"step took longer than step_timeout_s = {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True)
class TaskContext:
    goal: Goal
    queries: tuple[str, ...]
    oracle: TaskOracle


@dataclass
class _Episode:
    task: Task
    ctx: TaskContext
    state: PageState = SEARCH_PAGE
    steps: int = 0
    done: bool = False
    reached: set[str] = field(default_factory=set)


class WebshopSuite(EnvSuite):
    name = "webshop"

    def __init__(self, config: WebshopConfig, max_steps: int = 15) -> None:
        if max_steps < 1:
            raise EnvError(f"max_steps: must be >= 1, got {max_steps}")
        self.config = config
        self.max_steps = max_steps
        self.catalogue = generate_catalogue(config)
        self.site = Site(self.catalogue, SearchEngine(self.catalogue, config.search_return_n), config.results_per_page)
        self._pools: dict[str, list[Task]] | None = None
        self._contexts: dict[str, TaskContext] = {}

    @property
    def task_types(self) -> tuple[str, ...]:
        return self.config.categories

    # -- splits -----------------------------------------------------------------------------
    def _goal_products(self) -> dict[str, list[int]]:
        """Goal products per split: ID-category products cut into disjoint train / id pools."""
        cfg = self.config
        id_products = [p.idx for p in self.catalogue.products if p.category in cfg.id_categories]
        random.Random(f"webshop-split-{cfg.seed}").shuffle(id_products)
        cut = max(1, round(cfg.id_goal_fraction * len(id_products)))
        ood = [p.idx for p in self.catalogue.products if p.category in cfg.ood_categories]
        return {"train": sorted(id_products[cut:]), "id": sorted(id_products[:cut]), "ood": ood}

    def pools(self) -> dict[str, list[Task]]:
        """All instructions of each split; instruction texts never repeat across splits."""
        if self._pools is None:
            cfg, seen = self.config, set()
            sizes = {"train": cfg.train_instructions, "id": cfg.eval_instructions, "ood": cfg.eval_instructions}
            self._pools = {}
            for split, products in self._goal_products().items():
                rng, tasks = random.Random(f"webshop-goals-{cfg.seed}-{split}"), []
                for _ in range(20 * sizes[split]):
                    if len(tasks) == sizes[split]:
                        break
                    goal = make_goal(self.catalogue.products[rng.choice(products)], rng)
                    if goal.instruction in seen:
                        continue
                    seen.add(goal.instruction)
                    task_id = f"webshop/{split}/{goal.category}/{len(tasks):05d}"
                    queries = candidate_queries(goal, cfg.num_query_candidates, random.Random(task_id))
                    tasks.append(Task(task_id, split, goal.category, {**goal.to_payload(), "queries": list(queries)}))
                self._pools[split] = tasks
        return self._pools

    def tasks(self, split: str, n: int, seed: int = 0, *, start: int = 0) -> list[Task]:
        """Entries start..start+n-1 of a fixed permutation of the split's pool (disjoint ranges give
        disjoint tasks), in an order fixed by ``seed``."""
        if split not in SPLITS:
            raise EnvError(f"split: unknown {split!r}; allowed {list(SPLITS)}")
        pool = self.pools()[split]
        if not (0 <= n and 0 <= start and start + n <= len(pool)):
            raise EnvError(f"n: tasks {start}..{start + n - 1} asked from split {split!r}, which has {len(pool)}")
        order = self._order(split)[start:start + n]
        random.Random(f"webshop-tasks-{split}-{seed}").shuffle(order)
        return [pool[i] for i in order]

    def _order(self, split: str) -> list[int]:
        """The fixed permutation of the split's pool (position p of ``tasks`` -> pool entry)."""
        size = len(self.pools()[split])
        return random.Random(f"webshop-pool-{split}").sample(range(size), size)

    def task_positions(self, split: str, task_types) -> list[int]:
        """Positions of the split's instructions whose category is one of ``task_types``."""
        if split not in SPLITS:
            raise EnvError(f"split: unknown {split!r}; allowed {list(SPLITS)}")
        unknown = sorted(set(task_types) - set(self.config.categories))
        if unknown:
            raise EnvError(f"task types {unknown}: not in this suite's categories {list(self.config.categories)}")
        pool = self.pools()[split]
        return [p for p, i in enumerate(self._order(split)) if pool[i].task_type in task_types]

    def split_size(self, split: str) -> int:
        if split not in SPLITS:
            raise EnvError(f"split: unknown {split!r}; allowed {list(SPLITS)}")
        return len(self.pools()[split])

    def describe_splits(self) -> dict[str, Any]:
        cfg = self.config
        return {"env": "webshop-simulator", "seed": cfg.seed, "num_products": cfg.num_products,
                "split_by": "top-level product category; train / id goal products disjoint",
                "id_categories": list(cfg.id_categories), "ood_categories": list(cfg.ood_categories),
                "train": {"categories": list(cfg.id_categories), "instructions": len(self.pools()["train"])},
                "id": {"categories": list(cfg.id_categories), "instructions": len(self.pools()["id"]),
                       "goal_fraction": cfg.id_goal_fraction},
                "ood": {"categories": list(cfg.ood_categories), "instructions": len(self.pools()["ood"])}}

    # -- episodes ---------------------------------------------------------------------------
    def context(self, task: Task) -> TaskContext:
        ctx = self._contexts.get(task.task_id)
        if ctx is None:
            try:
                goal = Goal.from_payload(task.payload)
                queries = tuple(task.payload["queries"])
            except (KeyError, TypeError, ValueError) as e:
                raise EnvError(f"task {task.task_id}: malformed WebShop payload ({e!r})") from None
            if goal.asin not in self.catalogue.by_asin:
                raise EnvError(f"task {task.task_id}: goal {goal.asin} is not in this catalogue (seed/num_products differ)")
            if len(self._contexts) >= _CONTEXT_CACHE:
                self._contexts.clear()
            ctx = self._contexts[task.task_id] = TaskContext(goal, queries, TaskOracle(self.site, goal, queries))
        return ctx

    def make_vector_env(self, num_envs: int, *, oracle: bool = False) -> VectorEnv:
        if num_envs < 1:
            raise EnvError(f"num_envs: must be >= 1, got {num_envs}")
        return WebshopVectorEnv(self, num_envs, oracle)

    def text_corpus(self) -> Iterable[str]:
        yield from ("WebShop", "Instruction:", "Search", "Back to Search", "< Prev", "Next >", "Description",
                    "Features", "Buy Now", "Rating: N.A.", "Thank you for shopping with us!",
                    "Your score (min 0.0, max 1.0)", BACK, PREV, NEXT, BUY, "click[description]", "click[features]")
        for root, attrs, subs in CATEGORIES.values():
            yield root
            yield from attrs
            yield from subs
        for p in self.catalogue.products:
            yield from (p.asin, f"click[{p.asin.lower()}]", p.title, f"Price: {p.price_tag}", p.description, *p.features)
            for group, vals in p.options:
                yield " ".join((group, *vals))
        for pool in self.pools().values():
            for t in pool:
                yield t.payload["instruction"]
                yield from (f"search[{q}]" for q in t.payload["queries"])


class WebshopVectorEnv(VectorEnv):
    def __init__(self, suite: WebshopSuite, num_envs: int, oracle: bool) -> None:
        self.suite = suite
        self._num_envs = num_envs
        self.oracle = oracle
        self._episodes: list[_Episode] = []
        self._last: list[Observation] = []

    @property
    def num_envs(self) -> int:
        return self._num_envs

    def reset(self, tasks: Sequence[Task]) -> list[Observation]:
        if not 1 <= len(tasks) <= self._num_envs:
            raise EnvError(f"reset: {len(tasks)} tasks for {self._num_envs} environments")
        self._episodes = [_Episode(t, self.suite.context(t)) for t in tasks]
        self._last = [self._observe(ep) for ep in self._episodes]
        return list(self._last)

    def _observe(self, ep: _Episode, score: float = 0.0) -> Observation:
        site, ctx = self.suite.site, ep.ctx
        text = site.render(ep.state, ctx.goal.instruction, score)
        admissible = () if ep.done else site.admissible(ep.state, ctx.queries)
        oracle = None
        if self.oracle:
            oracle = () if ep.done else ctx.oracle.actions(ep.state, admissible)
        return Observation(text, ctx.goal.instruction, admissible, site.state_key(ep.state), oracle)

    def step(self, actions: Sequence[str | None]) -> list[StepResult | None]:
        if len(actions) != len(self._episodes):
            raise EnvError(f"step: {len(actions)} actions for {len(self._episodes)} episodes")
        return [None if ep.done else self._guarded_step(i, a) for i, (ep, a) in enumerate(zip(self._episodes, actions))]

    def _guarded_step(self, i: int, action: str | None) -> StepResult:
        """``_step`` of episode ``i``; an exception or timeout ends it as errored (traceback kept)."""
        ep = self._episodes[i]
        if action is None:
            raise EnvError(f"step: action None for the active episode of {ep.task.task_id}")
        try:
            with step_deadline(self.suite.config.step_timeout_s):
                fault_point("env.step")  # test-only fault injection (envs/faults.py)
                result = self._step(ep, action)
        except Exception:  # noqa: BLE001 - a simulator fault ends this episode, not the batch
            ep.done = True
            return StepResult(self._last[i], reward=0.0, done=True, won=False, score=0.0,
                              error=traceback.format_exc(), info={"steps": ep.steps})
        self._last[i] = result.observation
        return result

    def _step(self, ep: _Episode, action: str) -> StepResult:
        ctx, site = ep.ctx, self.suite.site
        ep.steps += 1
        nxt = site.transition(ep.state, action)
        invalid = nxt is None
        new_subgoals = []
        if not invalid:
            new_subgoals = [s for s in ctx.oracle.subgoals(ep.state, nxt) if s not in ep.reached]
            ep.reached.update(new_subgoals)
            ep.state = nxt
        info: dict[str, Any] = {"page": ep.state.page, "steps": ep.steps}
        score = 0.0
        if ep.state.page == "done":
            product = site.product(ep.state)
            r = get_reward(product, ctx.goal, dict(ep.state.options))
            score = r.score
            info.update(asin=product.asin, r_type=r.r_type, r_att=r.r_att, r_option=r.r_option,
                        r_price=r.r_price, options=dict(ep.state.options))
        ep.done = ep.state.page == "done" or ep.steps >= self.suite.max_steps
        won = score >= 1.0 - SCORE_EPS
        return StepResult(self._observe(ep, score), reward=score, done=ep.done, won=won, score=score,
                          invalid=invalid, subgoals=tuple(new_subgoals), info=info)
