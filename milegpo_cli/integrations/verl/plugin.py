"""The ``verl.plugins`` entry point: ``import verl`` imports this module in every verl process (the
driver, its TaskRunner, the agent-loop workers), which registers the estimators, the trainer mode
and the agent loops. ``VERL_USE_EXTERNAL_MODULES=milegpo_cli.integrations.verl.plugin`` does the
same where entry points are off (``VERL_USE_EXTERNAL_PLUGINS=none``)."""
from . import estimators  # noqa: F401  (registers algorithm.adv_estimator=milegpo, milegpo_gigpo, ...)
from . import trainer  # noqa: F401  (registers trainer.v1.trainer_mode=milegpo_sync)
from . import agent_loops  # noqa: F401  (registers the agent loops milegpo_alfworld, milegpo_webshop)
