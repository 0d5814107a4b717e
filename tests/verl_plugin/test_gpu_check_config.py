"""bench/verl_gpu_check.sh has not run (no GPU); its Hydra overrides at least compose against verl
0.9.1's own ppo_trainer config (a key verl does not know, or one missing its '+', fails here)."""
import re
import shlex
from pathlib import Path

import verl
from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_checks_overrides_compose_with_verls_config():
    text = (ROOT / "bench" / "verl_gpu_check.sh").read_text()
    assert "PREPARED, NOT YET RUN" in text
    block = text[text.index("-m verl.trainer.main_ppo"):text.index("2>&1 | tee")]
    env = {"OUT": "/tmp/out", "MODEL": "/tmp/model", "PWD": str(ROOT)}
    overrides = [re.sub(r"\$(\w+)", lambda m: env[m.group(1)], a) for a in shlex.split(block.replace("\\\n", " "))[2:]]
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        cfg = compose("ppo_trainer", overrides=overrides)
    assert (cfg.algorithm.adv_estimator, cfg.trainer.v1.trainer_mode) == ("milegpo", "milegpo_sync")
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "milegpo_alfworld"
    assert Path(cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path).is_file()
    assert cfg.trainer.total_training_steps == 2 and cfg.actor_rollout_ref.rollout.name == "vllm"
