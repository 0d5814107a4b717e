"""credit.memory (credit/memory.py, docs/algorithms.md "Memory across iterations") and the interchange fields
task / iteration: identical outputs without them, credit in all-fail groups of tasks that succeeded earlier,
causality, --drop memory, batch-at-once = iteration by iteration, bounded size."""
import gzip
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from milegpo_cli.credit import CreditConfig, Rollout, RolloutBatch, compute_advantages
from milegpo_cli.credit.batch import CreditError
from milegpo_cli.credit.memory import TaskMemory, fold
from milegpo_cli.interchange import InterchangeError, parse_rollout, rollout_line, run_credit_file

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
ON = CreditConfig(memory=True)


def corridor(task: str, iteration: int, paths: list[list[str]], won: list[bool]) -> list[Rollout]:
    """One group: rollout i walks paths[i] (actions name the next state), reward 10 on a winning last step."""
    return [Rollout(f"{task}|{iteration}", i, p, [f"to {q}" for q in p[1:]] + ["end"],
                    [0.0] * (len(p) - 1) + [10.0 * w], float(w), task=task, iteration=iteration)
            for i, (p, w) in enumerate(zip(paths, won))]


EARLIER = corridor("t", 0, [["s", "a", "b"], ["s", "a", "b"], ["s", "c", "c"], ["s", "c", "d"]], [True, True, False, False])
ALL_FAIL = corridor("t", 1, [["s", "a", "x"], ["s", "c", "c"], ["s", "c", "d"], ["s", "d", "d"]], [False] * 4)


def result(rollouts, config=ON, **kw):
    return compute_advantages(RolloutBatch.from_rollouts(rollouts), "milegpo", config, **kw)


def steps_of(batch: RolloutBatch, group: str) -> np.ndarray:
    return np.flatnonzero(np.asarray(batch.group_names)[batch.step_group] == group)


def test_all_fail_group_of_a_task_that_succeeded_earlier_gets_credit_toward_the_old_milestone():
    batch = RolloutBatch.from_rollouts(EARLIER + ALL_FAIL)
    later = steps_of(batch, "t|1")
    without = compute_advantages(batch, "milegpo", CreditConfig()).advantage[later]
    with_memory = compute_advantages(batch, "milegpo", ON).advantage[later]
    assert np.allclose(without[[0, 3, 6, 9]], without[0])  # s -> a and s -> c look alike without memory
    s_to_a, s_to_c = with_memory[0], with_memory[3]  # rollout 0 steps s -> a (toward SUCCESS earlier), rollout 1 s -> c
    assert s_to_a > 0 > s_to_c


def test_no_task_fields_give_identical_outputs_with_memory_on():
    rollouts = [replace(r, task=None, iteration=None) for r in EARLIER + ALL_FAIL]
    a, b = result(rollouts, CreditConfig()), result(rollouts, ON)
    for name in ("advantage", "credit", "step_advantage", "episode_advantage"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert b.memory == {}  # nothing to remember, the memory handed in (none) passes through


@pytest.mark.parametrize("name", ["rollouts_webshop.jsonl.gz", "rollouts_alfworld.jsonl.gz"])
def test_recordings_without_task_are_bit_for_bit_unchanged(name, tmp_path):
    """The project's recordings (no task / iteration): `milegpo credit` writes the same bytes with memory on or off."""
    src = tmp_path / "in.jsonl"
    with gzip.open(RESULTS / name, "rt") as f:
        src.write_text("".join(line for _, line in zip(range(400), f)))
    run_credit_file(src, tmp_path / "off.jsonl", "milegpo")
    run_credit_file(src, tmp_path / "on.jsonl", "milegpo", overrides={"credit.memory": True})
    assert (tmp_path / "off.jsonl").read_bytes() == (tmp_path / "on.jsonl").read_bytes()


def test_credit_file_with_task_and_iteration_uses_the_memory(tmp_path):
    from milegpo_cli.interchange import write_rollouts
    write_rollouts(tmp_path / "in.jsonl", EARLIER + ALL_FAIL)
    for overrides, config in (({"credit.memory": True}, ON), ({}, CreditConfig())):
        run_credit_file(tmp_path / "in.jsonl", tmp_path / "out.jsonl", "milegpo", overrides=overrides)
        got = [json.loads(x)["advantage"] for x in (tmp_path / "out.jsonl").read_text().splitlines()]
        assert got == result(EARLIER + ALL_FAIL, config).advantage.tolist()
    run_credit_file(tmp_path / "in.jsonl", tmp_path / "drop.jsonl", "milegpo", drop=["memory"],
                    overrides={"credit.memory": True})
    assert (tmp_path / "drop.jsonl").read_bytes() == (tmp_path / "out.jsonl").read_bytes()


def test_task_fields_change_nothing_while_memory_is_off():
    stripped = [replace(r, task=None, iteration=None) for r in EARLIER + ALL_FAIL]
    assert np.array_equal(result(EARLIER + ALL_FAIL, CreditConfig()).advantage, result(stripped, CreditConfig()).advantage)


def test_drop_memory_is_memory_off():
    a = result(EARLIER + ALL_FAIL, CreditConfig()).advantage
    assert np.array_equal(result(EARLIER + ALL_FAIL, ON, drop={"memory"}).advantage, a)
    assert np.array_equal(result(EARLIER + ALL_FAIL, CreditConfig(memory=True, drop=("memory",))).advantage, a)


def test_causal_later_iterations_do_not_change_earlier_ones():
    alone = result(EARLIER).advantage
    batch = RolloutBatch.from_rollouts(EARLIER + ALL_FAIL)
    together = compute_advantages(batch, "milegpo", ON).advantage[steps_of(batch, "t|0")]
    assert np.array_equal(alone, together)
    # groups of the same iteration do not see each other either
    same_it = [replace(r, iteration=0, group="t|b") for r in ALL_FAIL]
    batch = RolloutBatch.from_rollouts(EARLIER + same_it)
    assert np.array_equal(compute_advantages(batch, "milegpo", ON).advantage[steps_of(batch, "t|0")], alone)


def test_a_batch_at_once_equals_iteration_by_iteration_with_the_memory_handed_on():
    """The trainer's path: one batch per iteration, the memory carried between calls."""
    third = corridor("t", 2, [["s", "c", "a", "b"], ["s", "d", "d"], ["s", "a", "y"]], [True, False, False])
    other = corridor("u", 1, [["s", "a", "b"], ["s", "e"]], [True, False])
    rollouts = EARLIER + ALL_FAIL + other + third
    at_once = result(rollouts)
    memory, parts = {}, []
    for it in range(3):
        res = result([r for r in rollouts if r.iteration == it], memory=memory)
        memory = res.memory
        parts.append(res.advantage)
    order = np.argsort([r.iteration for r in rollouts], kind="stable")
    lengths = [len(rollouts[i].states) for i in order]
    by_iteration = np.split(np.concatenate(parts), np.cumsum(lengths)[:-1])
    expected = np.split(at_once.advantage, np.cumsum([len(r.states) for r in rollouts])[:-1])
    for k, i in enumerate(order):
        assert np.allclose(by_iteration[k], expected[i], rtol=0, atol=1e-12)
    assert memory.keys() == at_once.memory.keys() and memory["t"].states == at_once.memory["t"].states


def test_a_memory_from_the_same_or_a_later_iteration_is_refused():
    memory = result(EARLIER + ALL_FAIL).memory
    with pytest.raises(CreditError, match="iteration"):
        result(ALL_FAIL, memory=memory)


def test_memory_stays_bounded_over_a_thousand_iterations():
    cfg = CreditConfig(memory=True, memory_states=16)
    mem = None
    rng = np.random.default_rng(0)
    for it in range(1000):  # every iteration visits 40 new states and a few old ones
        keys = [f"n{it}-{j}" for j in range(40)] + [f"old{j}" for j in rng.integers(0, 5, 3)]
        part = TaskMemory(it, 8.0, 1.0, {k: (1.0, 1.0, 2.0) for k in keys},
                          {(a, b): 1.0 for a, b in zip(keys, keys[1:])})
        mem = fold(mem, part, cfg.memory_decay, cfg.memory_floor, cfg.memory_states)
        assert len(mem.states) <= 16 and len(mem.edges) <= 64
    assert mem.rollouts < 8.0 / (1 - cfg.memory_decay) + 1e-9  # geometric: the decayed totals converge


def test_interchange_fields_round_trip_and_errors():
    line = json.dumps({"group": "g", "rollout": 0, "outcome": 1.0, "task": "t", "iteration": 3,
                       "steps": [{"state": "s", "action": "a", "reward": 1.0}]})
    r = parse_rollout(line, 1)
    assert (r.task, r.iteration) == ("t", 3) and json.loads(rollout_line(r))["iteration"] == 3
    plain = parse_rollout(json.dumps({"group": "g", "rollout": 0, "outcome": 0.0, "steps": []}), 1)
    assert "task" not in json.loads(rollout_line(plain))
    only_task = parse_rollout(json.dumps({"group": "g", "rollout": 0, "outcome": 0.0, "steps": [], "task": "t"}), 1)
    assert (only_task.task, only_task.iteration) == ("t", None)  # kept, but no order: the memory ignores it
    assert RolloutBatch.from_rollouts([only_task]).group_task is None
    for bad, field in (({"iteration": 1}, "task"),
                       ({"task": "t", "iteration": True}, "iteration"), ({"task": "t", "iteration": -1}, "iteration"),
                       ({"task": 3, "iteration": 1}, "task")):
        with pytest.raises(InterchangeError) as e:
            parse_rollout(json.dumps({"group": "g", "rollout": 0, "outcome": 0.0, "steps": [], **bad}), 7)
        assert e.value.field == field and e.value.line == 7


def test_rollouts_of_one_group_must_agree_on_task_and_iteration():
    rollouts = [ALL_FAIL[0], replace(ALL_FAIL[1], iteration=2)]
    with pytest.raises(CreditError, match="task"):
        RolloutBatch.from_rollouts(rollouts)


def test_memory_settings_are_checked():
    for bad in ({"memory_decay": 0.0}, {"memory_floor": 1.5}, {"memory_states": 0}, {"memory": 1}):
        with pytest.raises(ValueError):
            CreditConfig(**bad)


def test_memory_evidence_subsets_and_pooled_reference():
    """bench/memory_evidence.py: the subsets it scores, and its pooled reference is causal (iteration 0 alone)."""
    import sys
    sys.path.insert(0, str(RESULTS.parents[0]))
    from memory_evidence import pooled_advantages, subset_masks

    from milegpo_cli.experiments.credit_bench import Recording
    never = corridor("u", 1, [["s", "c"], ["s", "d"]], [False, False])
    rollouts = EARLIER + ALL_FAIL + never
    records = [{"group": r.group, "rollout": r.rollout_id, "outcome": r.outcome, "success": bool(r.outcome),
                "task": r.task, "iteration": r.iteration, "p": 0.5, "task_type": "x",
                "steps": [{"state": s, "action": a, "reward": w, "oracle_good": True, "subgoals": []}
                          for s, a, w in zip(r.states, r.actions, r.rewards)]} for r in rollouts]
    rec = Recording.from_records(records)
    masks = subset_masks(rec)
    assert masks["all-fail"].tolist() == [False] * 4 + [True] * 6
    assert masks["all-fail, succeeded earlier"].tolist() == [False] * 4 + [True] * 4 + [False] * 2
    pooled = pooled_advantages(rec, CreditConfig())
    first = sum(len(r.states) for r in EARLIER)
    assert np.array_equal(pooled[:first], result(EARLIER, CreditConfig()).advantage)


def test_any_string_is_a_state_key_even_the_empty_one():
    """SUCCESS is not a string in the memory, so a state named "" is a state (and survives the store's JSON form)."""
    earlier = corridor("t", 0, [["s", "", "b"], ["s", "c", "c"]], [True, False])
    memory = result(earlier).memory["t"]
    assert ("s", "") in memory.edges and ("b", None) in memory.edges and "" in memory.states
    assert TaskMemory.from_dict(json.loads(json.dumps(memory.to_dict()))) == memory


def test_corridor_family_recording_and_the_memory_on_it(tmp_path, monkeypatch):
    """bench/memory_evidence.py record --env corridor: the oracle walks each corridor in its length, labels are
    the oracle's; on a small recording of the family the memory lifts the AUC inside all-fail groups of tasks
    that succeeded earlier well above plain v3's (0.571 -> 0.978 on the 60-task recording)."""
    import random
    monkeypatch.syspath_prepend(str(RESULTS.parents[1]))
    from bench import memory_evidence
    from bench.corridor_family import corridor as corridor_task, play

    from milegpo_cli.experiments.credit_bench import Recording
    from milegpo_cli.experiments.credit_recording import read_records
    length, closets = corridor_task(3, seed=1)
    oracle = play(3, length, closets, p=0.0, rng=random.Random(0), max_steps=30)
    assert oracle["success"] and len(oracle["steps"]) == length and all(s["oracle_good"] for s in oracle["steps"])
    monkeypatch.setattr(memory_evidence, "RESULTS", tmp_path)
    memory_evidence.main(["record", "--env", "corridor", "--tasks", "16", "--iterations", "4", "--p", "0.86",
                          "--seed", "1"])
    records = read_records(tmp_path / "rollouts_memory_corridor-s1.jsonl.gz")
    assert len(records) == 16 * 4 * 8 and {r["iteration"] for r in records} == {0, 1, 2, 3}
    rec = Recording.from_records(records)
    rows = memory_evidence.score(rec, {"v3": CreditConfig(), "memory": ON}, n_resamples=50)
    auc = {(r["variant"], r["subset"]): r["auc"] for r in rows}
    earlier = "all-fail, succeeded earlier"
    assert auc["memory", earlier] > auc["v3", earlier] + 0.2 and auc["memory", "all"] > auc["v3", "all"]
