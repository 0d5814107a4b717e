"""The project's estimators as verl advantage estimators (``algorithm.adv_estimator=NAME``).

verl 0.9's ``compute_advantage`` calls a registered estimator with ``token_level_rewards``,
``response_mask``, ``config`` (the ``algorithm`` section) and ``index`` (= ``uid``) only. The
per-turn fields of :data:`~.turns.FIELDS` reach it through :func:`turn_fields`, a context the
trainer hook (:mod:`.trainer`, ``trainer.v1.trainer_mode=milegpo_sync``) opens around verl's
advantage step. Credit settings: ``algorithm.milegpo_credit`` (the keys of ``milegpo credit --set``).
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Mapping, Sequence

import numpy as np
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import register_adv_est

from ...credit import ALGORITHMS, CreditConfig
from .turns import row_advantages

# verl name -> the project's estimator
ESTIMATOR_NAMES = {("milegpo" if algo == "milegpo" else f"milegpo_{algo}"): algo for algo in ALGORITHMS}
CREDIT_KEY = "milegpo_credit"

_turn_fields: contextvars.ContextVar[Sequence[Mapping] | None] = contextvars.ContextVar("milegpo_turn_fields",
                                                                                        default=None)


@contextlib.contextmanager
def turn_fields(rows: Sequence[Mapping]) -> Iterator[None]:
    """Hand each row's ``extra_fields`` (in the row order of the batch verl is about to pass) to the
    estimators called inside this block."""
    token = _turn_fields.set(list(rows))
    try:
        yield
    finally:
        _turn_fields.reset(token)


def credit_config(algo_config) -> CreditConfig:
    """``algorithm.milegpo_credit`` as a CreditConfig (absent: the defaults of ``milegpo credit``)."""
    if algo_config is None:
        return CreditConfig()
    settings = algo_config.get(CREDIT_KEY) if hasattr(algo_config, "get") else getattr(algo_config, CREDIT_KEY, None)
    if OmegaConf.is_config(settings):
        settings = OmegaConf.to_container(settings, resolve=True)
    settings = dict(settings or {})
    try:
        return CreditConfig.from_dict(settings)
    except ValueError as err:
        raise ValueError(f"algorithm.{CREDIT_KEY}.{err}") from None


def _estimator(name: str, algo: str):
    def estimate(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, config=None, index=None,
                 **_unused) -> tuple[torch.Tensor, torch.Tensor]:
        fields = _turn_fields.get()
        if fields is None:
            raise ValueError(f"algorithm.adv_estimator={name}: no per-turn fields reached the estimator; set "
                             "trainer.v1.trainer_mode=milegpo_sync (docs/scale.md, 'MileGPO in verl')")
        if index is None:
            raise ValueError(f"algorithm.adv_estimator={name}: the batch has no uid")
        outcomes = token_level_rewards.detach().sum(dim=-1).double().cpu().numpy()
        per_row = row_advantages(outcomes, np.asarray(index, dtype=object), fields, algo, credit_config(config))
        mask = response_mask.to(token_level_rewards.dtype)
        adv = torch.as_tensor(per_row, device=mask.device).to(mask.dtype).unsqueeze(-1) * mask
        return adv, adv

    estimate.__name__ = estimate.__qualname__ = f"compute_{name}_advantage"
    estimate.__doc__ = (f"verl estimator {name!r}: A_k of the project's {algo!r} (docs/algorithms.md) on the "
                        "regrouped episodes, times response_mask[k] (one value on every response token of row k).")
    return estimate


for _name, _algo in ESTIMATOR_NAMES.items():  # verl refuses a name another estimator holds
    register_adv_est(_name)(_estimator(_name, _algo))
