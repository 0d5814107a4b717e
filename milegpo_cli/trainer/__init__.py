"""The shared core trainer: group rollouts, PPO update, checkpoints, one iteration, the run."""
