import json

import numpy as np
import pytest

from milegpo_cli.credit import CreditConfig, Rollout, RolloutBatch, compute_advantages
from milegpo_cli.interchange import InterchangeError, read_rollouts, run_credit_file, write_rollouts

ROLLOUTS = [Rollout("g", "0", ["s0", "s1", "s2"], ["a", "b", "c"], [0, 0, 10], 1.0),
            Rollout("g", "1", ["s0", "s3", "s3"], ["x", "y", "y"], [0, 0, 0], 0.0),
            Rollout("g", 2, ["s0", "s1", "s4"], ["a", "b", "d"], [0, 0, 0], 0.0, success=False),
            Rollout("g", "3", ["s0", "s1", "s2"], ["a", "b", "c"], [0, 0, 10], 1.0),
            Rollout("h", "0", [], [], [], 0.0)]


def test_round_trip(tmp_path):
    path = tmp_path / "r.jsonl"
    write_rollouts(path, ROLLOUTS)
    back = read_rollouts(path)
    assert [(r.group, r.rollout_id, list(r.states), list(r.actions), list(r.rewards), r.outcome, r.success)
            for r in back] == [(r.group, r.rollout_id, list(r.states), list(r.actions), [float(x) for x in r.rewards],
                                r.outcome, r.success) for r in ROLLOUTS]


# the same rollouts with per-step invalid flags and the true subgoals newly reached at each step
FLAGGED = [Rollout("g", "0", ["s0", "s1", "s2"], ["a", "b", "c"], [0, 0, 10], 1.0, invalid=[False, True, False],
                   subgoals=[[], ["found"], ["found-2", "bought"]]),
           Rollout("g", "1", ["s0", "s3", "s3"], ["x", "y", "y"], [0, 0, 0], 0.0, invalid=[True, True, False],
                   subgoals=[[], [], []]),
           Rollout("g", 2, ["s0", "s1", "s4"], ["a", "b", "d"], [0, 0, 0], 0.0, success=False,
                   invalid=[False] * 3, subgoals=[[], ["found"], []]),
           Rollout("g", "3", ["s0", "s1", "s2"], ["a", "b", "c"], [0, 0, 10], 1.0, invalid=[False] * 3,
                   subgoals=[["found"], [], ["bought"]])]


def test_round_trip_of_invalid_flags_and_subgoals(tmp_path):
    path = tmp_path / "r.jsonl"
    write_rollouts(path, FLAGGED + [Rollout("h", 0, ["s0"], ["a"], [0], 0.0)])
    back = read_rollouts(path)
    assert [(list(r.invalid), [list(g) for g in r.subgoals]) for r in back[:4]] == \
        [(r.invalid, r.subgoals) for r in FLAGGED]
    assert back[4].invalid is None and back[4].subgoals is None  # absent stays absent
    last = json.loads(path.read_text().splitlines()[4])
    assert set(last["steps"][0]) == {"state", "action", "reward"}
    batch = RolloutBatch.from_rollouts(back)
    assert batch.step_invalid[:6].tolist() == [False, True, False, True, True, False]


def test_oracle_milestones_reads_subgoals_from_the_file(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_rollouts(src, FLAGGED)
    run_credit_file(src, out, "oracle-milestones", overrides={})
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    res = compute_advantages(RolloutBatch.from_rollouts(FLAGGED), "oracle-milestones", CreditConfig())
    assert np.allclose([x["advantage"] for x in lines], res.advantage)
    assert [x["milestone"] for x in lines] == [bool(g) for r in FLAGGED for g in r.subgoals]
    gigpo = compute_advantages(RolloutBatch.from_rollouts(FLAGGED), "gigpo", CreditConfig())
    assert not np.allclose(res.advantage, gigpo.advantage)  # the subgoals were used


def test_invalid_flags_from_the_file_reach_the_penalty(tmp_path):
    flagged, plain, out = tmp_path / "f.jsonl", tmp_path / "p.jsonl", tmp_path / "out.jsonl"
    write_rollouts(flagged, FLAGGED)
    write_rollouts(plain, [Rollout(r.group, r.rollout_id, r.states, r.actions, r.rewards, r.outcome, r.success)
                           for r in FLAGGED])
    advantages = []
    for src in (flagged, plain):
        run_credit_file(src, out, "gigpo", overrides={"credit.invalid_penalty": 0.1})
        advantages.append([json.loads(x)["advantage"] for x in out.read_text().splitlines()])
    res = compute_advantages(RolloutBatch.from_rollouts(FLAGGED), "gigpo", CreditConfig(invalid_penalty=0.1))
    assert np.allclose(advantages[0], res.advantage) and not np.allclose(advantages[0], advantages[1])


def test_oracle_milestones_without_subgoals_names_the_line_and_writes_nothing(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_rollouts(src, FLAGGED[:2] + ROLLOUTS[2:3] + FLAGGED[3:])
    with pytest.raises(InterchangeError) as err:
        run_credit_file(src, out, "oracle-milestones", overrides={})
    assert (err.value.line, err.value.field) == (3, "steps[0].subgoals")
    assert "oracle-milestones" in str(err.value) and not out.exists()


def test_reward_optional_and_blank_lines_and_extra_keys(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"group": "g", "rollout": 1, "outcome": 1, "steps": [{"state": "s", "action": "a"}], "task": "x"}\n\n')
    (r,) = read_rollouts(path)
    assert r.rewards == [0.0] and r.success is None


@pytest.mark.parametrize("algo", ["grpo", "gigpo", "graphgpo", "milegpo"])
def test_run_credit_file_matches_compute_advantages(tmp_path, algo):
    src, out, ms = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "ms.json"
    write_rollouts(src, ROLLOUTS)
    summary = run_credit_file(src, out, algo, drop=["reliability"], overrides={"credit.gamma": 0.9, "omega": 0.5},
                              milestones_path=ms)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    cfg = CreditConfig(gamma=0.9, omega=0.5)
    batch = RolloutBatch.from_rollouts(ROLLOUTS)
    res = compute_advantages(batch, algo, cfg, drop={"reliability"})
    assert len(lines) == batch.num_steps == summary["steps"] == 12
    assert set(lines[0]) == {"group", "rollout", "t", "advantage", "episode_advantage", "step_advantage", "credit",
                             "milestone", "trap"}
    assert [(x["group"], x["rollout"], x["t"]) for x in lines[:4]] == [("g", "0", 0), ("g", "0", 1), ("g", "0", 2),
                                                                        ("g", "1", 0)]
    assert lines[6]["rollout"] == 2  # ids keep their JSON type
    assert np.allclose([x["advantage"] for x in lines], res.advantage)
    assert [x["milestone"] for x in lines] == res.milestone.tolist()
    doc = json.loads(ms.read_text())
    assert doc["algo"] == algo and len(doc["candidates"]) == len(res.candidates)
    if algo == "milegpo":
        trap = [c for c in doc["candidates"] if c["kind"] == "trap"][0]
        assert trap["key"] == "s3" and trap["distance"] is None and trap["rho"] == -1.0


BAD = [
    ('{"group": "g", "rollout": 0, "outcome": 1, "steps": []}\n{"group": "g", "rollout": 1, "outcome": 1, "steps": [}\n',
     2, "<json>"),
    ('{"group": "g", "outcome": 1, "steps": []}\n', 1, "rollout"),
    ('{"group": "g", "rollout": 0, "outcome": NaN, "steps": []}\n', 1, "outcome"),
    ('{"group": "g", "rollout": 0, "outcome": Infinity, "steps": []}\n', 1, "outcome"),
    ('{"group": "g", "rollout": 0, "outcome": 1, "steps": [{"state": "s", "action": "a", "reward": "1"}]}\n', 1,
     "steps[0].reward"),
    ('{"group": "g", "rollout": 0, "outcome": 1, "steps": [{"action": "a"}]}\n', 1, "steps[0].state"),
    ('{"group": 3, "rollout": 0, "outcome": 1, "steps": []}\n', 1, "group"),
    ('{"group": "g", "rollout": true, "outcome": 1, "steps": []}\n', 1, "rollout"),
    ('{"group": "g", "rollout": 0, "outcome": 1, "success": 1, "steps": []}\n', 1, "success"),
    ('{"group": "g", "rollout": 0, "outcome": 1, "steps": {}}\n', 1, "steps"),
    ('[1, 2]\n', 1, "<json>"),
    ('{"group": "g", "rollout": 0, "outcome": 1, "steps": [{"state": "s", "action": "a", "invalid": 1}]}\n', 1,
     "steps[0].invalid"),
    ('{"group": "g", "rollout": 0, "outcome": 1, "steps": [{"state": "s", "action": "a", "subgoals": "x"}]}\n', 1,
     "steps[0].subgoals"),
    ('{"group": "g", "rollout": 0, "outcome": 1, "steps": [{"state": "s", "action": "a", "subgoals": [3]}]}\n', 1,
     "steps[0].subgoals[0]"),
    ('{"group": "g", "rollout": 0, "outcome": 1, "steps": [{"state": "s", "action": "a", "subgoals": []},'
     ' {"state": "t", "action": "a"}]}\n', 1, "steps[1].subgoals"),
    ('{"group": "g", "rollout": 0, "outcome": 1, "steps": []}\n\n{"group": "g", "rollout": 0, "outcome": 0, "steps": []}\n',
     3, "rollout"),
]


@pytest.mark.parametrize("text,line,field", BAD)
def test_malformed_lines_name_line_and_field_and_write_nothing(tmp_path, text, line, field):
    src, out, ms = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "ms.json"
    src.write_text(text)
    out.write_text("previous\n")
    with pytest.raises(InterchangeError) as err:
        run_credit_file(src, out, "milegpo", overrides={}, milestones_path=ms)
    assert (err.value.line, err.value.field) == (line, field)
    assert f"line {line}" in str(err.value)
    assert out.read_text() == "previous\n" and not ms.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]  # no temp files left


def test_bad_algo_or_override_writes_nothing(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_rollouts(src, ROLLOUTS)
    with pytest.raises(ValueError, match="algo"):
        run_credit_file(src, out, "nope", overrides={})
    with pytest.raises(ValueError, match="gama"):
        run_credit_file(src, out, "gigpo", overrides={"credit.gama": 0.9})
    with pytest.raises(ValueError, match="drop"):
        run_credit_file(src, out, "milegpo", drop=["nothing"], overrides={})
    assert not out.exists()
