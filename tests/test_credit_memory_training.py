"""credit.memory in training (trainer/credit_memory.py): the memory is kept in the store, a resumed run gives
the same advantages as an uninterrupted one, and `milegpo diagnose` shows the memory credit per iteration."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from test_trainer import make_config, models_dir, quiet  # noqa: F401  (models_dir: the shared tiny-model fixture)

from milegpo_cli.credit import RolloutBatch, compute_advantages
from milegpo_cli.experiments.diagnose import diagnose, render_diagnosis, stored_rollouts
from milegpo_cli.store import RunStore
from milegpo_cli.trainer import loop

# two tasks in the pool, two groups per iteration: every iteration replays both tasks, so each recalls its past
MEMORY = ["run.algo=\"milegpo\"", "credit.memory=true", "rollout.train_tasks=2", "run.iterations=4",
          "checkpoint.every=2", "checkpoint.keep=2", "eval.every=4", "run.seed=5", "env.max_steps=6"]


def test_memory_rows_round_trip_and_superseded_rows_are_pruned(store_url):
    """On SQLite and PostgreSQL: the stored memory reads back equal (as of any iteration), and pruning keeps
    exactly the rows a resume from the given iteration or later can read."""
    from milegpo_cli.credit.memory import SUCCESS_KEY, TaskMemory
    store = RunStore(store_url)
    run_id = store.create_run("r", "milegpo")
    mem = TaskMemory(1, 8.0, 0.5 ** 0.5, {"s": (1 / 3, 2.0, 3.0), "a": (0.1, 0.0, 0.0)}, {("s", "a"): 0.7, ("a", SUCCESS_KEY): 0.3})
    for it, task in ((1, "a"), (1, "b"), (3, "a"), (5, "a")):
        store.record_task_memory(run_id, it, {task: replace(mem, iteration=it).to_dict()})
    assert TaskMemory.from_dict(store.task_memory(run_id, 4)["b"]) == mem
    assert {t: m["iteration"] for t, m in store.task_memory(run_id, 4).items()} == {"a": 3, "b": 1}
    store.prune_task_memory(run_id, 4)
    assert {t: m["iteration"] for t, m in store.task_memory(run_id, 2).items()} == {"b": 1}  # a@1 is gone
    assert {t: m["iteration"] for t, m in store.task_memory(run_id, 9).items()} == {"a": 5, "b": 1}
    store.close()


def advantages(store, run_id):
    return [(s["state_key"], s["action"], s["advantage"]) for s in store.steps(run_id)]


@pytest.mark.slow
def test_resumed_run_continues_with_the_stored_memory(tmp_path, models_dir, monkeypatch):  # noqa: F811
    a_cfg = make_config("webshop", tmp_path / "a", models_dir, *MEMORY)
    a_store = RunStore(a_cfg.store.db)
    a_id = loop.train(a_cfg, a_store, a_cfg.store.mlflow_uri, console=quiet())
    rows = a_store.task_memory(a_id, 4)
    assert len(rows) == 2 and all(m["iteration"] == 4 and m["states"] for m in rows.values())
    assert len(a_store.task_memory(a_id, 2)) == 2 and all(m["iteration"] == 2 for m in a_store.task_memory(a_id, 2).values())
    assert a_store.task_memory(a_id, 1) == {}  # pruned: no kept checkpoint resumes to iteration 1

    def crashed_then_resumed(path, forget: bool):
        cfg = make_config("webshop", path, models_dir, *MEMORY)
        store = RunStore(cfg.store.db)
        real, calls = loop.train_iteration, []

        def crash_at_4(config, *args, **kw):  # iteration 3 is stored (with its memory), its checkpoint never written
            calls.append(args[-1])
            if len(calls) == 4:
                raise KeyboardInterrupt("simulated crash during iteration 4")
            return real(config, *args, **kw)

        with monkeypatch.context() as m:
            m.setattr(loop, "train_iteration", crash_at_4)
            with pytest.raises(KeyboardInterrupt):
                loop.train(cfg, store, cfg.store.mlflow_uri, console=quiet())
        run_id = store.list_runs()[-1]["id"]
        with monkeypatch.context() as m:
            if forget:  # the control: a resume that starts from an empty memory
                m.setattr(RunStore, "task_memory", lambda self, run_id, upto: {})
            loop.train(cfg, store, None, resume_run=run_id, console=quiet())
        assert calls == [1, 2, 3, 4]
        return store, run_id

    b_store, b_id = crashed_then_resumed(tmp_path / "b", forget=False)
    assert advantages(a_store, a_id) == advantages(b_store, b_id)
    assert a_store.task_memory(a_id, 4) == b_store.task_memory(b_id, 4)
    c_store, c_id = crashed_then_resumed(tmp_path / "c", forget=True)
    assert advantages(a_store, a_id) != advantages(c_store, c_id)  # so the equality above needs the stored memory

    # the stored rollouts carry their task and iteration: v3 recomputed on the whole run gives what training used
    data = stored_rollouts(a_store, a_id)
    again = compute_advantages(RolloutBatch.from_rollouts(data["rollouts"]), "milegpo", a_cfg.credit).advantage
    assert np.array_equal(again, data["advantage"])

    d = diagnose(a_store, a_id, n_resamples=20)
    assert [m["iteration"] for m in d["memory"]] == [1, 2, 3, 4]
    assert d["memory"][0]["tasks"] == 2 and d["memory"][-1]["entries"] > 0
    assert all(0 <= m["credited_groups"] <= m["all_fail_groups"] <= 2 for m in d["memory"])
    assert any("memory" in str(getattr(part, "title", "")) for part in render_diagnosis(d))
