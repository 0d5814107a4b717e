"""A prepared GPU check of the paper recipe's code path (recipes/alfworld-paper.toml: generate mode,
LoRA on every linear layer, KL to the adapter-disabled reference, bf16, gradient accumulation) on
randomly initialised Qwen2.5-structured models, with nothing downloaded.

For each size (0.5b, 1.5b: Qwen2.5-0.5B / 1.5B-Instruct's published configs, vocabulary included;
toy: the same structure at tiny widths) it builds the model from its config with random weights and
a byte-level BPE tokenizer trained here (ids past the tokenizer decode to nothing), then runs one
training iteration of the recipe (trainer.iteration.train_iteration: rollouts, credit, PPO update) and
measures:
- rollout: tokens generated per second over the rollout (every reply of a random model runs to
  max_new_tokens), and environment steps per second;
- update: loss tokens per second of the PPO update (its own ``tokens_per_s``);
- memory: peak GPU memory (torch.cuda.max_memory_allocated; on CPU the process's peak RSS) against
  ``milegpo train --dry-run``'s estimated peak for the same config (trainer/plan.py).
One CSV row per size: bench/results/gpu_check.csv (``--out``).

    python bench/gpu_check.py                     # on a GPU: 0.5b and 1.5b, under 5 minutes on an H100
    python bench/gpu_check.py --size toy --out /tmp/gpu_check.csv   # on CPU, seconds (tests/test_gpu_check.py)
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("ALFWORLD_DATA", str(REPO / "runs" / "alfworld_data"))

COLUMNS = ["size", "device", "parameters", "trainable", "episodes", "max_steps", "max_prompt_tokens", "max_new_tokens",
           "rollout_s", "generated_tokens", "rollout_tokens_per_s", "rollout_steps_per_s", "update_s",
           "update_tokens", "update_tokens_per_s", "peak_gib", "planned_peak_gib", "peak_over_plan", "wall_s"]
TOY_WIDTHS = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
                  num_key_value_heads=1)
SIZES = {"0.5b": "Qwen/Qwen2.5-0.5B-Instruct", "1.5b": "Qwen/Qwen2.5-1.5B-Instruct", "toy": "Qwen/Qwen2.5-1.5B-Instruct"}
# per size: (groups, group size, env steps, prompt tokens, new tokens) of the check's one iteration
SHAPES = {"0.5b": (4, 8, 2, 2048, 512), "1.5b": (4, 8, 2, 2048, 512), "toy": (2, 2, 2, 192, 8)}


def build_model(size: str, folder: Path) -> Path:
    """A local checkpoint: the size's Qwen2.5 config (toy: tiny widths) with random weights, and a
    tokenizer trained on the prompt templates and ALFWorld commands."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from milegpo_cli.policy.prompts import template_corpus
    from milegpo_cli.policy.tiny import train_tokenizer
    from milegpo_cli.trainer.plan import KNOWN_ARCHITECTURES

    corpus = template_corpus() + ["go to countertop 1", "take apple 1 from countertop 1", "open fridge 1",
                                  "You arrive at countertop 1. On the countertop 1, you see a apple 1."]
    tok = train_tokenizer(corpus, 320 if size == "toy" else 2000)
    values = {k: v for k, v in KNOWN_ARCHITECTURES[SIZES[size]].items() if k != "model_type"}
    if size == "toy":
        values.update(TOY_WIDTHS, vocab_size=len(tok))
    config = Qwen2Config(**{**values, "bos_token_id": tok.eos_token_id, "eos_token_id": tok.eos_token_id,
                            "pad_token_id": tok.eos_token_id, "torch_dtype": "bfloat16"})
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def check(size: str, root: Path, recipe: str = "alfworld-paper") -> dict:
    """One iteration of ``recipe`` on the size's random model; the CSV row."""
    import torch

    import milegpo_cli.policy.core as core
    from milegpo_cli.config import load_config
    from milegpo_cli.trainer import builders, iteration as one_iteration
    from milegpo_cli.trainer.plan import make_plan
    from milegpo_cli.trainer.ppo import PPOUpdater
    from milegpo_cli.trainer.threads import plan_threads

    t_start = time.perf_counter()
    groups, group_size, steps, prompt, new = SHAPES[size]
    folder = build_model(size, root / f"model-{size}")
    config = load_config(recipe, [
        f"policy.model={json.dumps(str(folder))}", f"policy.max_prompt_tokens={prompt}", f"policy.max_new_tokens={new}",
        f"rollout.groups={groups}", f"rollout.group_size={group_size}", f"rollout.train_tasks={2 * groups}",
        f"env.max_steps={steps}", "run.iterations=1", "ppo.minibatch_size=16", f"store.root={json.dumps(str(root))}",
        "env.alfworld.workers=0", f"env.alfworld.data_dir={json.dumps(str(REPO / 'runs' / 'alfworld'))}"])
    plan = make_plan(config, world_size=1)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    threads = plan_threads(config)
    suite = builders.build_suite(config, threads.rollout.workers)
    accelerator = builders.make_accelerator(config)
    policy = builders.build_policy(config, suite, accelerator.device)
    updater = PPOUpdater(policy, config.ppo, accelerator, total_updates=1)
    venv = suite.make_vector_env(groups * group_size, oracle=False)
    generated = [0]
    sample = core.sample_replies

    def counted(*args, **kw):
        replies = sample(*args, **kw)
        generated[0] += sum(len(ids) for ids, _ in replies)
        return replies

    core.sample_replies = counted  # counts the reply tokens of the real sampler
    try:
        res = one_iteration.train_iteration(config, policy, updater, venv, one_iteration.train_pool(config, suite), suite, 1,
                                          threads=threads)
    finally:
        core.sample_replies = sample
        venv.close()
        suite.close()
    m = res.metrics
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**30
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB, the whole process
    return {"size": size, "device": torch.cuda.get_device_name() if cuda else "cpu", "parameters": plan.parameters,
            "trainable": plan.trainable, "episodes": groups * group_size, "max_steps": steps,
            "max_prompt_tokens": prompt, "max_new_tokens": new, "rollout_s": round(m["time_rollout_s"], 3),
            "generated_tokens": generated[0], "rollout_tokens_per_s": round(generated[0] / m["time_rollout_s"], 1),
            "rollout_steps_per_s": round(m["rollout_steps_per_s"], 2), "update_s": round(m["time_update_s"], 3),
            "update_tokens": int(m.get("tokens", 0)), "update_tokens_per_s": round(m.get("tokens_per_s", 0.0), 1),
            "peak_gib": round(peak, 3), "planned_peak_gib": round(plan.memory["peak"], 3),
            "peak_over_plan": round(peak / plan.memory["peak"], 3), "wall_s": round(time.perf_counter() - t_start, 1)}


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", action="append", choices=sorted(SIZES), help="repeatable [default: 0.5b and 1.5b]")
    ap.add_argument("--recipe", default="alfworld-paper")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "gpu_check.csv")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        for size in args.size or ["0.5b", "1.5b"]:
            rows.append(check(size, Path(tmp), args.recipe))
            print(", ".join(f"{k} {v}" for k, v in rows[-1].items()), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {args.out}")
    return args.out


if __name__ == "__main__":
    main()
