"""The core trainer end to end on tiny configs: one WebShop/ALFWorld run per estimator, resume
equivalence after a crash, evaluations stored, `milegpo rollout` on a checkpoint."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from rich.console import Console

from milegpo_cli.config import Config, load_config
from milegpo_cli.store import RunStore
from milegpo_cli.trainer import loop, checkpoint_eval, resume
from milegpo_cli.trainer.checkpoint import list_checkpoints
from milegpo_cli.trainer.shared_start import shared_start
from milegpo_cli.trainer.testbed import KEYS as TESTBED_KEYS
from conftest import TINY_MODEL

torch.set_num_threads(1)
os.environ.setdefault("ALFWORLD_DATA", str(Path(__file__).resolve().parents[1] / "runs" / "alfworld_data"))

TINY = [*TINY_MODEL,
        "rollout.groups=2", "rollout.group_size=2", "ppo.epochs=1",
        "eval.episodes=2", "eval.splits=['id']", "eval.probe_states=6", "run.threads=1", "warmstart.enabled=false",
        "base.enabled=false", "rollout.train_tasks=8"]
ENV = {
    "webshop": ["env.max_steps=4", "env.webshop.num_products=300", "env.webshop.train_instructions=80",
                "env.webshop.eval_instructions=8"],
    "alfworld": ["env.max_steps=4", "env.alfworld.workers=0",  # games cached once for all tests
                 f"env.alfworld.data_dir={json.dumps(str(Path(__file__).resolve().parents[1] / 'runs' / 'alfworld'))}"],
}
TIMING = ("time", "per_s", "host_", "tokens_per_s")


def quiet() -> Console:
    return Console(file=open(os.devnull, "w"), width=120)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


def make_config(env: str, root: Path, models: Path, *extra: str):
    (root / "models").parent.mkdir(parents=True, exist_ok=True)
    if not (root / "models").exists():
        (root / "models").symlink_to(models, target_is_directory=True)  # the tiny model is built once
    return load_config(env, [*TINY, *ENV[env], f"store.root={json.dumps(str(root))}", *extra])


def stable(metrics: dict) -> dict:
    """Iteration metrics without wall-clock figures."""
    return {k: v for k, v in metrics.items() if not any(t in k for t in TIMING)}


@pytest.mark.slow
@pytest.mark.parametrize("env", ["webshop", "alfworld"])
@pytest.mark.parametrize("algo", ["grpo", "gigpo", "graphgpo", "milegpo"])
def test_one_iteration_end_to_end(env, algo, tmp_path, models_dir):
    if env == "alfworld":
        pytest.importorskip("alfworld")
    config = make_config(env, tmp_path, models_dir, f"run.algo={json.dumps(algo)}", "run.iterations=1",
                         "eval.every=1", "checkpoint.every=1")
    store = RunStore(config.store.db)
    run_id = loop.train(config, store, config.store.mlflow_uri, console=quiet())

    assert store.get_run(run_id)["status"] == "finished"
    (it,) = store.iterations(run_id)
    assert it["iteration"] == 1 and it["episodes"] == 4
    update_keys = ("policy_loss", "entropy", "clip_frac", "kl")
    if it["metrics"].get("no_signal"):  # every advantage 0 (e.g. GRPO, all 4 episodes failed): no step
        assert it["metrics"]["adv_zero_share"] == 1.0 and it["metrics"]["optimizer_steps"] == 0
        update_keys = ()
    for key in (*update_keys, "success_rate", "mean_length", "invalid_rate", "milestones", "traps",
                "credit_nonzero_share", "time_rollout_s", "time_credit_s", "time_update_s"):
        assert key in it["metrics"], key
    steps = store.steps(run_id, iteration=1)
    assert len(steps) == sum(e["length"] for e in store.episodes(run_id, iteration=1)) > 0
    assert all(s["oracle_good"] is not None for s in steps[:1])  # oracle labels stored
    if algo == "grpo":  # omega = 0 is not forced, but GRPO has no step-level credit
        assert all(s["credit"] == 0 for s in steps)
    evals = store.evaluations(run_id)
    assert {(e["iteration"], e["split"]) for e in evals} == {(0, "id"), (1, "id")}
    assert all(e["episodes"] == 2 for e in evals)
    assert [i for i, _ in list_checkpoints(resume.checkpoint_root(config, run_id))] == [1]


@pytest.mark.slow
def test_resume_after_crash_equals_uninterrupted_run(tmp_path, models_dir, monkeypatch):
    extra = ["run.iterations=4", "checkpoint.every=2", "checkpoint.keep=2", "eval.every=2", "run.seed=3"]
    a_cfg = make_config("webshop", tmp_path / "a", models_dir, *extra)
    a_store = RunStore(a_cfg.store.db)
    a_id = loop.train(a_cfg, a_store, a_cfg.store.mlflow_uri, console=quiet())

    b_cfg = make_config("webshop", tmp_path / "b", models_dir, *extra)
    b_store = RunStore(b_cfg.store.db)
    real = loop.train_iteration
    calls = []

    def crash_at_4(config, *args, **kw):  # iteration 3 is stored, its checkpoint never written
        calls.append(args[-1])
        if len(calls) == 4:
            raise KeyboardInterrupt("simulated crash during iteration 4")
        return real(config, *args, **kw)

    monkeypatch.setattr(loop, "train_iteration", crash_at_4)
    with pytest.raises(KeyboardInterrupt):
        loop.train(b_cfg, b_store, b_cfg.store.mlflow_uri, console=quiet())
    b_id = b_store.list_runs()[-1]["id"]
    assert b_store.get_run(b_id)["status"] == "killed"
    assert [r["iteration"] for r in b_store.iterations(b_id)] == [1, 2, 3]
    loop.train(b_cfg, b_store, None, resume_run=b_id, console=quiet())
    assert calls == [1, 2, 3, 4, 3, 4]  # resumed from the checkpoint of iteration 2

    a_its, b_its = a_store.iterations(a_id), b_store.iterations(b_id)
    assert [r["iteration"] for r in b_its] == [1, 2, 3, 4]
    assert [stable(r["metrics"]) for r in a_its] == [stable(r["metrics"]) for r in b_its]
    key = lambda s: (s["state_key"], s["action"], s["reward"], s["advantage"])  # noqa: E731
    assert [key(s) for s in a_store.steps(a_id)] == [key(s) for s in b_store.steps(b_id)]
    a_ev = [(e["iteration"], e["split"], e["success_rate"], e["mean_outcome"]) for e in a_store.evaluations(a_id)]
    b_ev = [(e["iteration"], e["split"], e["success_rate"], e["mean_outcome"]) for e in b_store.evaluations(b_id)]
    assert sorted(a_ev) == sorted(b_ev)
    a_w = torch.load(list_checkpoints(resume.checkpoint_root(a_cfg, a_id))[-1][1] / "trainer.pt", weights_only=False)
    b_w = torch.load(list_checkpoints(resume.checkpoint_root(b_cfg, b_id))[-1][1] / "trainer.pt", weights_only=False)
    for sa, sb in zip(a_w["optimizer"]["state"].values(), b_w["optimizer"]["state"].values()):
        assert torch.equal(sa["exp_avg"], sb["exp_avg"])


@pytest.mark.slow
def test_rollout_command_evaluates_a_checkpoint_and_records(tmp_path, models_dir):
    config = make_config("webshop", tmp_path, models_dir, "run.iterations=1", "eval.every=1", "checkpoint.every=1")
    store = RunStore(config.store.db)
    run_id = loop.train(config, store, config.store.mlflow_uri, console=quiet())
    record = tmp_path / "rollouts.jsonl"
    metrics = checkpoint_eval.evaluate(store, run_id, "ood", 3, checkpoint=1, record_path=record, console=quiet())
    assert 0.0 <= metrics["success_rate"] <= 1.0
    ev = [e for e in store.evaluations(run_id) if e["checkpoint"]]
    assert len(ev) == 1 and ev[0]["split"] == "ood" and ev[0]["episodes"] == 3 and ev[0]["iteration"] == 1
    lines = [json.loads(x) for x in record.read_text().splitlines()]
    assert len(lines) == 3 and all(len(x["steps"]) >= 1 for x in lines)
    assert all(x["task"] == x["group"] and x["iteration"] == 1 for x in lines)  # the checkpoint's iteration
    assert all(isinstance(s["invalid"], bool) and isinstance(s["subgoals"], list) for x in lines for s in x["steps"])
    assert all(isinstance(x["final_state"], str) and x["final_state"] for x in lines)
    with pytest.raises(Exception, match="no checkpoint for iteration 7"):
        checkpoint_eval.evaluate(store, run_id, "ood", 3, checkpoint=7, console=quiet())


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["", "verl-agent"])
def test_credit_on_the_recorded_steps_gives_the_advantages_training_stored(preset, tmp_path, models_dir):
    """``steps[t].reward`` has one meaning (docs/rollouts.md): a run's stored training steps, written as
    a recording, give under `milegpo credit` with the run's [credit] settings the advantages it stored;
    `rollout --record` writes the same rewards (the penalty carried by `invalid` under the preset)."""
    from milegpo_cli.credit import Rollout
    from milegpo_cli.interchange import run_credit_file, write_rollouts
    from milegpo_cli.trainer.rollout import INVALID_ACTION

    config = make_config("webshop", tmp_path, models_dir, "run.algo='gigpo'", "run.iterations=1",
                         "checkpoint.every=1", "policy.action_mode='generate'", "policy.max_new_tokens=3",
                         f"credit.preset={json.dumps(preset)}")
    store = RunStore(config.store.db)
    run_id = loop.train(config, store, config.store.mlflow_uri, console=quiet())
    steps = store.steps(run_id, iteration=1)
    rollouts = []
    for e in store.episodes(run_id, iteration=1):
        own = [s for s in steps if s["episode_id"] == e["id"]]
        rollouts.append(Rollout(e["group"], e["index"], [s["state_key"] for s in own], [s["action"] for s in own],
                                [s["reward"] for s in own], e["outcome"], bool(e["success"]),
                                invalid=[s["action"] == INVALID_ACTION for s in own], final_state=e["final_state"]))
    assert any(any(r.invalid) for r in rollouts)  # the tiny model's replies are often unparsable
    write_rollouts(tmp_path / "train.jsonl", rollouts)
    run_credit_file(tmp_path / "train.jsonl", tmp_path / "adv.jsonl", "gigpo",
                    overrides=store.get_run(run_id)["config"]["credit"])
    computed = [json.loads(x)["advantage"] for x in (tmp_path / "adv.jsonl").read_text().splitlines()]
    assert computed == pytest.approx([s["advantage"] for s in steps], abs=1e-9)

    record = tmp_path / "eval.jsonl"
    checkpoint_eval.evaluate(store, run_id, "id", 2, checkpoint=1, record_path=record, console=quiet())
    invalid_rewards = {s["reward"] for x in record.read_text().splitlines() for s in json.loads(x)["steps"]
                       if s["invalid"]}
    assert invalid_rewards <= ({0.0} if preset else {-0.1})


@pytest.mark.slow
def test_warm_start_is_recorded_as_iteration_zero(tmp_path, models_dir):
    config = make_config("webshop", tmp_path, models_dir, "run.iterations=1", "eval.every=1", "checkpoint.every=1",
                         "warmstart.enabled=true", "warmstart.episodes=4", "warmstart.epochs=2", "eval.untrained=true")
    store = RunStore(config.store.db)
    run_id = loop.train(config, store, config.store.mlflow_uri, console=quiet())
    its = store.iterations(run_id)
    assert [r["iteration"] for r in its] == [0, 1]
    ws = its[0]["metrics"]
    assert ws["phase"] == "warmstart" and ws["warmstart_walkthroughs"] == 4 and ws["warmstart_steps"] > 0
    assert ws["warmstart_loss_last_epoch"] < ws["warmstart_loss_first_epoch"]
    assert store.get_run(run_id)["config"]["warmstart"]["enabled"] is True
    phases = [(e["iteration"], e["phase"]) for e in store.evaluations(run_id)]
    assert phases == [(0, "untrained"), (0, "warmstart"), (1, "train")]
    assert all("probe_expert_logp" in e["metrics"] for e in store.evaluations(run_id))


@pytest.mark.slow
def test_rollout_reads_the_newest_checkpoint_again_when_training_prunes_it(tmp_path, models_dir, monkeypatch):
    """A run still training removes its older checkpoints; `rollout --run` that finds the newest gone
    mid-read reads the then-newest and says so, instead of failing on a manifest mismatch."""
    from envs import faults

    config = make_config("webshop", tmp_path, models_dir, "run.iterations=2", "checkpoint.every=1",
                         "checkpoint.keep=2", "eval.every=2")
    store = RunStore(config.store.db)
    run_id = loop.train(config, store, config.store.mlflow_uri, console=quiet())
    faults._hits.clear()
    monkeypatch.setenv(faults.ENV_VAR, "rollout.checkpoint_read:1:flag")  # checkpoint 2 goes while it is read
    out = tmp_path / "out.txt"
    checkpoint_eval.evaluate(store, run_id, "id", 2, console=Console(file=open(out, "w"), width=300))
    text = out.read_text()
    assert "checkpoint 2 was removed while it was read" in text and f"run {run_id} checkpoint 1:" in text
    assert [e["checkpoint"] for e in store.evaluations(run_id) if e["checkpoint"]] == [f"checkpoints/run_{run_id}/iter_000001"]
    faults._hits.clear()


@pytest.mark.slow
def test_a_run_that_starts_like_a_finished_one_shares_its_start_evaluation(tmp_path, models_dir):
    """The start evaluation of a run that starts exactly like a finished run of the store (same seed, base
    policy, evaluation, code) is that run's, copied; the rest of the run is what it would have been."""
    pytest.importorskip("alfworld")
    from mlflow.tracking import MlflowClient

    extra = ["base.enabled=true", "base.walkthroughs=4", "base.epochs=1", "eval.untrained=false", "run.seed=5",
             "run.iterations=2", "eval.every=1", "checkpoint.every=2", "env.alfworld.workers=2"]

    def train(*more):
        config = make_config("alfworld", tmp_path, models_dir, *extra, *more)
        store = RunStore(config.store.db)
        return store, loop.train(config, store, config.store.mlflow_uri, console=quiet())

    store, first = train()
    _, again = train()  # the same run again: its start is first's, the rest is played
    _, other = train('run.algo="grpo"', "ppo.lr=0.001", "credit.gamma=0.9")  # another method, the same start
    _, reseeded = train("run.seed=6")
    _, narrower = train("eval.probe_states=4")  # another evaluation: played
    shared = {r: store.iterations(r)[0]["metrics"].get("start_evaluation_from_run")
              for r in (first, again, other, reseeded, narrower)}
    assert shared == {first: None, again: first, other: first, reseeded: None, narrower: None}

    # the code counts by its source digest (trainer/provenance.py), not its git commit
    row = store.get_run(again)
    config, testbed = Config.from_dict(row["config"]), {k: row["versions"][k] for k in TESTBED_KEYS}
    store.set_provenance(again, "0" * 40, {})  # a docs-only commit: the same source
    assert shared_start(store, again, config, testbed) == first
    store.set_provenance(again, row["git_commit"], {"milegpo_source": "edited"})  # an uncommitted edit
    assert shared_start(store, again, config, testbed) is None

    def evaluations(run):
        return [(e["iteration"], e["phase"], e["split"], e["metrics"],
                 [(ep["task_id"], ep["success"], ep["length"]) for ep in store.episodes(run, evaluation_id=e["id"])],
                 [(s["t"], s["state_key"], s["action"]) for s in store.steps(run, evaluation_id=e["id"])])
                for e in store.evaluations(run)]

    assert [e[:2] for e in evaluations(again)] == [(0, "warmstart"), (1, "train"), (2, "train")]
    assert evaluations(again) == evaluations(first)  # iteration 0 copied; 1 and 2 played, equal
    assert evaluations(other)[0] == evaluations(first)[0] and evaluations(other)[0][4]
    assert ([stable(r["metrics"]) for r in store.iterations(again)[1:]]
            == [stable(r["metrics"]) for r in store.iterations(first)[1:]])
    mlflow = MlflowClient(store.get_run(again)["config"]["store"]["mlflow_uri"] or None)
    history = mlflow.get_metric_history(store.get_run(again)["mlflow_run_id"], "eval_warmstart_id/success_rate")
    assert [(m.step, m.value) for m in history] == [(0, evaluations(first)[0][3]["success_rate"])]
