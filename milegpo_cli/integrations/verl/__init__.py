"""MileGPO and the baselines inside verl 0.9 (docs/scale.md, "MileGPO in verl"); needs ``pip install 'milegpo[verl]'``.

:mod:`.turns` (pure: turn rows <-> rollouts), :mod:`.estimators` (``algorithm.adv_estimator``),
:mod:`.trainer` (``trainer.v1.trainer_mode=milegpo_sync``: the per-turn fields reach the estimators),
:mod:`.agent_loops` (ALFWorld and WebShop, one row per turn), :mod:`.plugin` (what ``import verl`` loads).
Nothing here is imported by the rest of milegpo.
"""
