#!/usr/bin/env bash
# PREPARED, NOT YET RUN: no GPU has been lent to this project so far; this script has never run end to end.
# (Its parts are tested on CPU in tests/verl_plugin: the estimators, the milegpo_sync trainer hook, the ALFWorld
# agent loop, and its Hydra overrides compose against verl 0.9.1's config (test_gpu_check_config.py). The
# vLLM / FSDP side has not run anywhere. Record the first run's output in docs/scale.md, "MileGPO in verl".)
#
# Two training steps of verl 0.9.1 on ALFWorld with Qwen2.5-0.5B-Instruct on 1 GPU: vLLM rollouts
# driven by our agent loop (milegpo_alfworld, one row per turn), algorithm.adv_estimator=milegpo,
# trainer.v1.trainer_mode=milegpo_sync. Prints the training throughput (verl's perf/throughput, tokens/s)
# and the GPU's peak memory (nvidia-smi, all processes). Sized for < 8 minutes on one H100, install included:
# 8 tasks x 4 rollouts x <= 8 turns, 256 response tokens a turn.
#
#   MODEL=/path/to/Qwen2.5-0.5B-Instruct WHEELS=/path/to/wheel-cache bench/verl_gpu_check.sh
#
# MODEL: a local copy of the model (the GPU machine reaches no hub); WHEELS (optional): a folder of wheels
# for torch (CUDA), vllm and the rest, used with --no-index when set. Output: runs/verl_gpu_check/.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:?set MODEL to a local folder of Qwen2.5-0.5B-Instruct}
OUT=${OUT:-runs/verl_gpu_check}
mkdir -p "$OUT"
START=$(date +%s)
PIP_ARGS=()
[ -n "${WHEELS:-}" ] && PIP_ARGS=(--no-index --find-links "$WHEELS")

python3 -m venv "$OUT/venv"
"$OUT/venv/bin/pip" install -q "${PIP_ARGS[@]}" 'verl[vllm]==0.9.1' 'transferqueue==0.1.11'
"$OUT/venv/bin/pip" install -q "${PIP_ARGS[@]}" -e .  # our [verl] extra's pins yield to verl[vllm]'s CUDA torch here
PY="$OUT/venv/bin/python"
echo "install: $(( $(date +%s) - START )) s"

export ALFWORLD_DATA=${ALFWORLD_DATA:-$PWD/runs/alfworld_data}
"$PY" -m milegpo_cli.integrations.verl.dataset alfworld train 64 "$OUT/train.parquet"
"$PY" -m milegpo_cli.integrations.verl.dataset alfworld id 8 "$OUT/val.parquet"

nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$OUT/gpu_memory_mib.txt" &
SMI=$!
trap 'kill $SMI 2>/dev/null || true' EXIT

"$PY" -m verl.trainer.main_ppo \
  trainer.use_v1=true trainer.v1.trainer_mode=milegpo_sync \
  algorithm.adv_estimator=milegpo algorithm.use_kl_in_reward=false \
  +algorithm.milegpo_credit.gamma=0.95 \
  data.train_files="$OUT/train.parquet" data.val_files="$OUT/val.parquet" \
  data.train_batch_size=8 data.max_prompt_length=2048 data.max_response_length=256 \
  data.return_raw_chat=true \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.actor.ppo_mini_batch_size=8 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.actor.use_kl_loss=false actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=4 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.5 actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.prompt_length=2048 actor_rollout_ref.rollout.response_length=256 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.rollout.agent.default_agent_loop=milegpo_alfworld \
  actor_rollout_ref.rollout.agent.agent_loop_config_path="$PWD/bench/verl_agent_loops.yaml" \
  actor_rollout_ref.rollout.agent.num_workers=4 \
  trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.total_training_steps=2 \
  trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1 \
  trainer.logger='[console]' trainer.project_name=milegpo trainer.experiment_name=verl_gpu_check \
  2>&1 | tee "$OUT/train.log"

kill $SMI 2>/dev/null || true
"$PY" - "$OUT" "$START" <<'EOF'
import re, sys, time
out, start = sys.argv[1], int(sys.argv[2])
log = open(f"{out}/train.log", errors="replace").read()
tput = [float(x) for x in re.findall(r"perf/throughput:([0-9.eE+-]+)", log)]
mem = [int(x) for x in open(f"{out}/gpu_memory_mib.txt").read().split() if x.isdigit()]
print(f"steps logged: {len(tput)}; tokens/s per step: {tput}")
print(f"peak GPU memory (nvidia-smi, all processes): {max(mem) / 1024:.1f} GiB" if mem else "no nvidia-smi samples")
print(f"wall, install included: {time.time() - start:.0f} s")
sys.exit(0 if len(tput) >= 2 else 1)
EOF
