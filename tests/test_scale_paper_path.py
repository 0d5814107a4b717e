"""The paper-scale path at toy size (issue 18): `train --dry-run` plans without loading weights, and
one iteration of recipes/{alfworld,webshop}-paper.toml's code path — generate mode, LoRA on every
linear layer, KL to the adapter-disabled reference, bf16 autocast through accelerate, gradient
accumulation — runs on a Qwen2-architecture model with Qwen2.5-1.5B's layer structure (tied
embeddings, q/k/v biases, 6:1 grouped-query attention, SwiGLU) at tiny widths."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from milegpo_cli.config import load_config
from milegpo_cli.trainer.plan import KNOWN_ARCHITECTURES, make_plan

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("ALFWORLD_DATA", str(REPO / "runs" / "alfworld_data"))
TOY_WIDTHS = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
                  num_key_value_heads=1)


@pytest.fixture(scope="module")
def toy_qwen(tmp_path_factory) -> Path:
    """A local folder: Qwen2.5-1.5B's config at tiny widths (saved like a hub checkpoint, no marker
    of ours) and a byte-level BPE tokenizer trained here."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from milegpo_cli.policy.prompts import template_corpus
    from milegpo_cli.policy.tiny import train_tokenizer

    folder = tmp_path_factory.mktemp("toy-qwen2")
    corpus = template_corpus() + ["go to countertop 1", "take apple 1 from countertop 1", "search[red shoes]",
                                  "click[buy now]", "You arrive at countertop 1. On the countertop 1, you see"]
    tok = train_tokenizer(corpus, 320)
    values = {k: v for k, v in KNOWN_ARCHITECTURES["Qwen/Qwen2.5-1.5B-Instruct"].items() if k != "model_type"}
    config = Qwen2Config(**{**values, **TOY_WIDTHS, "vocab_size": len(tok), "bos_token_id": tok.eos_token_id,
                            "eos_token_id": tok.eos_token_id, "pad_token_id": tok.eos_token_id})
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


# --- the plan ------------------------------------------------------------------------------

def test_plan_counts_exactly_from_a_local_config_without_weights(toy_qwen, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    config = load_config("alfworld-paper", [f"policy.model={json.dumps(str(toy_qwen))}"])
    plan = make_plan(config, world_size=2)
    model = AutoModelForCausalLM.from_pretrained(toy_qwen)
    lora = get_peft_model(model, LoraConfig(r=config.policy.lora_r, target_modules=list(config.policy.lora_targets)))
    trainable, total = lora.get_nb_trainable_parameters()
    assert plan.exact and plan.parameters == total - trainable and plan.trainable == trainable
    assert plan.batch["episodes_per_iteration"] == 2 * 16 * 8
    assert plan.tokens["per_step_max"] == 2048 + 512
    assert plan.memory["peak"] > plan.memory["weights"] > 0


def test_plan_of_an_uncached_hub_model_is_a_marked_estimate():
    plan = make_plan(load_config("alfworld-paper"))
    assert not plan.exact and plan.parameters == 1_543_714_304  # Qwen2.5-1.5B's published size: 1.54 B
    assert plan.trainable == 28 * 64 * (2 * (1536 + 1536) + 2 * (1536 + 256) + 3 * (1536 + 8960))
    assert 10 < plan.memory["peak"] < 80  # fits one 80 GiB GPU with ppo.micro_batch_size = 4
    unknown = make_plan(load_config("alfworld-paper", ["policy.model=someone/unknown-model"]))
    assert unknown.parameters is None and unknown.memory == {}


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path):
    from milegpo_cli.cli import app

    out = CliRunner().invoke(app, ["train", "--recipe", "alfworld-paper", "--dry-run", "--runs-dir", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "parameters: 1,543,714,304" in out.output and "ESTIMATE" in out.output
    assert "memory per GPU" in out.output and "per_iteration_max" in out.output
    assert list(tmp_path.iterdir()) == []
    tiny = CliRunner().invoke(app, ["train", "--recipe", "alfworld", "--dry-run", "--runs-dir", str(tmp_path)])
    assert tiny.exit_code == 0 and "ESTIMATE" not in tiny.output and "the recipe's [policy.tiny] config" in tiny.output


# --- one iteration of the paper recipes at toy size -------------------------------------------

ENV = {
    "alfworld": ["env.max_steps=3", "env.alfworld.workers=0",
                 f"env.alfworld.data_dir={json.dumps(str(REPO / 'runs' / 'alfworld'))}"],
    "webshop": ["env.max_steps=3", "env.webshop.num_products=300", "env.webshop.train_instructions=80",
                "env.webshop.eval_instructions=8"],
}


@pytest.mark.slow
@pytest.mark.parametrize("env", ["alfworld", "webshop"])
def test_one_iteration_of_the_paper_recipe_at_toy_size(env, toy_qwen, tmp_path, request):
    from safetensors.torch import load_file

    from milegpo_cli.store import RunStore
    from milegpo_cli.trainer import loop

    if env == "alfworld":
        pytest.importorskip("alfworld")
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)  # one per process: earlier tests made one without bf16
    request.addfinalizer(lambda: AcceleratorState._reset_state(True))  # and later tests need theirs
    config = load_config(f"{env}-paper", [
        f"policy.model={json.dumps(str(toy_qwen))}", "policy.max_prompt_tokens=192", "policy.max_new_tokens=8",
        "rollout.groups=2", "rollout.group_size=2", "rollout.train_tasks=8", "run.iterations=1", "run.threads=1",
        "eval.episodes=2", "eval.splits=['id']", "eval.probe_states=4", "eval.every=1", "checkpoint.every=1",
        "ppo.minibatch_size=8", "ppo.micro_batch_size=3", "ppo.lr=1e-3", f"store.root={json.dumps(str(tmp_path))}",
        *ENV[env]])
    assert (config.policy.action_mode, config.policy.lora, config.ppo.kl_coef, config.run.mixed_precision,
            config.policy.dtype) == ("generate", True, 0.01, "bf16", "bfloat16")
    store = RunStore(config.store.db)
    run_id = loop.train(config, store, config.store.mlflow_uri, console=Console(file=open(os.devnull, "w")))

    assert store.get_run(run_id)["status"] == "finished"
    (it,) = store.iterations(run_id)
    assert it["episodes"] == 4 and it["metrics"]["optimizer_steps"] >= 1
    assert {"kl", "approx_kl", "entropy", "policy_loss"} <= set(it["metrics"])
    ckpt = tmp_path / "checkpoints" / f"run_{run_id}"
    (policy_dir,) = [p for p in ckpt.rglob("policy.json")]
    meta = json.loads(policy_dir.read_text())
    assert meta["lora"] and meta["base"] == str(toy_qwen)  # a local base is referenced, not copied
    adapter = load_file(policy_dir.parent / "adapter" / "adapter_model.safetensors")
    lora_b = [v for k, v in adapter.items() if "lora_B" in k]
    assert len(lora_b) == 2 * 7 and any(v.abs().max() > 0 for v in lora_b)  # every linear layer, trained
