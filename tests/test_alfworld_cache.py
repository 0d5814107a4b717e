"""The ALFWorld transition cache is exact: random walks give byte-identical episodes with it on and off."""
import os
import random

import pytest

os.environ.setdefault("ALFWORLD_DATA", os.path.abspath("runs/alfworld_data"))

from envs.alfworld.engine import AlfworldVectorEnv  # noqa: E402
from envs.alfworld.game_env import TransitionCache  # noqa: E402
from envs.registry import make_suite  # noqa: E402


@pytest.fixture(scope="module")
def tasks(alfworld_config):
    return make_suite("alfworld", alfworld=alfworld_config, max_steps=12).tasks("train", 2)


def _walks(venv, tasks, seed: int, episodes: int) -> list:
    """Per episode, everything the env returned; actions drawn among the first three admissible
    commands (so that walks share prefixes and revisit states), sometimes an inadmissible one."""
    rng = random.Random(seed)
    out = []
    for k in range(episodes):
        task = tasks[k % len(tasks)]
        obs = venv.reset([task] * venv.num_envs)
        logs = [[(o.text, o.task, o.admissible, o.state_key, o.oracle_actions)] for o in obs]
        live = list(range(venv.num_envs))
        while live:
            acts = [None] * venv.num_envs
            for e in live:
                acts[e] = "<invalid>" if rng.random() < 0.05 else rng.choice(obs[e].admissible[:3])
            res = venv.step(acts)
            for e in live:
                r = res[e]
                o = r.observation
                logs[e].append((acts[e], o.text, o.admissible, o.state_key, o.oracle_actions, r.reward, r.done,
                                r.won, r.score, r.invalid, r.subgoals, r.error))
                obs[e] = o
            live = [e for e in live if not res[e].done]
        out += logs
    return out


def test_cache_on_and_off_give_identical_episodes(tasks):
    runs = {}
    for size in (0, 10_000):
        venv = AlfworldVectorEnv(4, expert="planner", max_steps=12, workers=0, expert_slots=2, cache_size=size)
        try:
            runs[size] = _walks(venv, tasks, seed=3, episodes=4)
        finally:
            venv.close()
    assert runs[0] == runs[10_000]
    assert any(step[4] for ep in runs[0] for step in ep[1:])  # oracle labels were part of the comparison


def test_grammar_shortcuts_give_identical_episodes(tasks):
    from envs.alfworld import engine_caches

    runs = {}
    try:
        for grammar in (False, True):
            engine_caches.install_engine_caches(True, grammar=grammar)
            venv = AlfworldVectorEnv(3, expert="planner", max_steps=12, workers=0, expert_slots=1, cache_size=0)
            try:
                runs[grammar] = _walks(venv, tasks, seed=5, episodes=4)
            finally:
                venv.close()
    finally:
        engine_caches.install_engine_caches(True)
    assert runs[False] == runs[True]


def test_a_reused_engine_plays_a_new_game_as_a_fresh_one(tasks):
    from envs.alfworld import engine_caches

    order = [tasks[0], tasks[1], tasks[0]]
    runs = {}
    try:
        for reuse in (False, True):
            engine_caches.install_engine_caches(True, reuse=reuse)
            venv = AlfworldVectorEnv(1, expert="planner", max_steps=12, workers=0, cache_size=0)
            try:
                runs[reuse] = [_walks(venv, [task], seed=k, episodes=1) for k, task in enumerate(order)]
            finally:
                venv.close()
    finally:
        engine_caches.install_engine_caches(True)
    assert runs[False] == runs[True]


def test_stored_translations_give_identical_episodes(tasks, tmp_path, monkeypatch):
    """Translations kept in this process, written to the folder, then read back from it (no translation
    in that run); a broken file is translated again and replaced."""
    from envs.alfworld import engine_caches

    translated = []
    translate = engine_caches._pddl2sas
    monkeypatch.setattr(engine_caches, "_pddl2sas", lambda *a, **k: translated.append(a) or translate(*a, **k))
    runs, counts = [], []
    try:
        for folder in (None, tmp_path, tmp_path, tmp_path):
            engine_caches.install_engine_caches(True, translations=folder and str(folder))
            if len(runs) == 3:
                broken = sorted(tmp_path.glob("*.pkl"))[0]
                broken.write_bytes(b"not a pickle")
            venv = AlfworldVectorEnv(3, expert="planner", max_steps=12, workers=0, expert_slots=1, cache_size=0)
            try:
                runs.append(_walks(venv, tasks, seed=5, episodes=4))
            finally:
                venv.close()
            counts.append(len(translated))
            translated.clear()
    finally:
        engine_caches.install_engine_caches(True)
    assert runs[0] == runs[1] == runs[2] == runs[3]
    assert counts == [4, 4, 0, 1]  # 2 games x (plain, optimised)
    assert len(list(tmp_path.glob("*.pkl"))) == 4 and not list(tmp_path.glob("*.tmp"))
    assert broken.read_bytes() != b"not a pickle"


def test_cache_hits_skip_the_engine_and_survive_eviction(tasks):
    from envs.alfworld import game_env

    venv = AlfworldVectorEnv(3, max_steps=12, workers=0, cache_size=7)  # tiny: evictions and replays
    cache = venv._cache
    assert isinstance(cache, TransitionCache) and cache.size == 7
    try:
        ref = AlfworldVectorEnv(3, max_steps=12, workers=0)
        try:
            assert _walks(venv, tasks, seed=5, episodes=3) == _walks(ref, tasks, seed=5, episodes=3)
        finally:
            ref.close()
        assert len(cache._edges) <= 7 and cache.hits > 0
    finally:
        venv.close()
    big = game_env.transition_cache(50_000)
    venv = AlfworldVectorEnv(4, max_steps=12, workers=0, cache_size=50_000)
    try:
        _walks(venv, tasks, seed=9, episodes=2)
        hits, misses = big.hits, big.misses
        _walks(venv, tasks, seed=9, episodes=2)  # the same walks again: every step is a hit
        assert big.hits - hits > 0 and big.misses == misses
    finally:
        venv.close()
