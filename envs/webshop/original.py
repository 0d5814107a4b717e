"""Adapter: the same EnvSuite interface over the original WebShop (princeton-nlp/WebShop).

Needs ``web_agent_site`` importable with its data and search index set up. The original's splits
are by goal index (as in its baselines): test = goals 0-499 (here "ood"), dev = 500-1499 ("id"),
train = 1500+ ("train"); they are not split by category. Oracle labels and subgoals are not
available for the original environment.
"""
from __future__ import annotations

import random
from typing import Any, Iterable, Sequence

from envs.base import EnvError, EnvSuite, Observation, StepResult, Task, VectorEnv

INSTALL_MESSAGE = ("the original WebShop is not installed: git clone https://github.com/princeton-nlp/WebShop, "
                   "run its ./setup.sh -d all (product data + Java/pyserini search index), then "
                   "pip install -e . in that folder so that `import web_agent_site` works")
SPLIT_RANGES = {"ood": (0, 500), "id": (500, 1500), "train": (1500, None)}


def _text_env_class():
    try:
        from web_agent_site.envs.web_agent_text_env import WebAgentTextEnv
    except ImportError as e:
        raise EnvError(f"{INSTALL_MESSAGE} ({e})") from None
    return WebAgentTextEnv


class OriginalWebshopSuite(EnvSuite):
    name = "webshop-original"

    def __init__(self, max_steps: int = 15, num_products: int | None = None, human_goals: bool = True) -> None:
        cls = _text_env_class()
        self.max_steps = max_steps
        self._cls = cls
        self._first = cls(observation_mode="text", num_products=num_products, human_goals=human_goals)
        self.server = self._first.server
        self.goals = self.server.goals

    def _indices(self, split: str) -> list[int]:
        if split not in SPLIT_RANGES:
            raise EnvError(f"split: unknown {split!r}; allowed {list(SPLIT_RANGES)}")
        lo, hi = SPLIT_RANGES[split]
        return list(range(lo, min(hi or len(self.goals), len(self.goals))))

    def split_size(self, split: str) -> int:
        return len(self._indices(split))

    def tasks(self, split: str, n: int, seed: int = 0, *, start: int = 0) -> list[Task]:
        """Goals start..start+n-1 of the split (in goal order), in an order fixed by ``seed``."""
        idxs = self._indices(split)
        if not (0 <= n and 0 <= start and start + n <= len(idxs)):
            raise EnvError(f"n: tasks {start}..{start + n - 1} asked from split {split!r}, which has {len(idxs)}")
        chosen = idxs[start:start + n]
        random.Random(f"webshop-original-{split}-{seed}").shuffle(chosen)
        return [Task(f"webshop-original/{split}/{i:05d}", split, self.goals[i].get("category", ""),
                     {"goal_index": i}) for i in chosen]

    def make_vector_env(self, num_envs: int, *, oracle: bool = False) -> VectorEnv:
        if oracle:
            raise EnvError("oracle: labels are not available for the original WebShop; use the simulator")
        envs = [self._cls(observation_mode="text", server=self.server, session_prefix=f"slot{j}-")
                for j in range(num_envs)]
        return OriginalVectorEnv(envs, self.max_steps)

    def text_corpus(self) -> Iterable[str]:
        for g in self.goals:
            yield g["instruction_text"]
        for p in self.server.all_products:
            yield p["Title"]

    def describe_splits(self) -> dict[str, Any]:
        return {"env": "webshop-original", "split_by": "goal index", "ranges": SPLIT_RANGES,
                "goals": len(self.goals)}


class OriginalVectorEnv(VectorEnv):
    def __init__(self, envs: list, max_steps: int) -> None:
        self.envs, self.max_steps = envs, max_steps
        self._steps: list[int] = []
        self._done: list[bool] = []
        self._goals: list[dict] = []

    @property
    def num_envs(self) -> int:
        return len(self.envs)

    def _observe(self, j: int, text: str) -> Observation:
        env, goal = self.envs[j], self._goals[j]
        avail = env.get_available_actions()
        acts = [f"search[{goal['instruction_text'].split(', and price')[0].lower()}]", f"search[{goal['query']}]"] \
            if avail["has_search_bar"] else []
        acts += [f"click[{c}]" for c in avail["clickables"] if c != "search"]
        key = env.state["url"].replace(env.session, "<session>")
        return Observation(text, env.instruction_text, tuple(acts), key, None)

    def reset(self, tasks: Sequence[Task]) -> list[Observation]:
        if not 1 <= len(tasks) <= len(self.envs):
            raise EnvError(f"reset: {len(tasks)} tasks for {len(self.envs)} environments")
        out = []
        self._steps, self._done, self._goals = [0] * len(tasks), [False] * len(tasks), []
        for j, t in enumerate(tasks):
            idx = t.payload["goal_index"]
            self._goals.append(self.envs[j].server.goals[idx])
            text, _ = self.envs[j].reset(session=idx)
            out.append(self._observe(j, text))
        return out

    def step(self, actions: Sequence[str | None]) -> list[StepResult | None]:
        if len(actions) != len(self._done):
            raise EnvError(f"step: {len(actions)} actions for {len(self._done)} episodes")
        out: list[StepResult | None] = []
        for j, a in enumerate(actions):
            if self._done[j]:
                out.append(None)
                continue
            if a is None:
                raise EnvError(f"step: action None for active episode {j}")
            before = self._observe(j, "")
            invalid = a not in before.admissible and not (a.startswith("search[") and before.admissible
                                                          and before.admissible[0].startswith("search["))
            text, reward, done, _ = self.envs[j].step(a)
            self._steps[j] += 1
            self._done[j] = bool(done) or self._steps[j] >= self.max_steps
            out.append(StepResult(self._observe(j, text), float(reward), self._done[j], reward >= 1.0,
                                  float(reward), invalid=invalid))
        return out
