"""Pure credit-assignment estimators (docs/algorithms.md): GRPO, GiGPO, GraphGPO, MileGPO."""
from .batch import Rollout, RolloutBatch
from .config import DROPPABLE, CreditConfig
from .registry import ALGORITHMS, compute_advantages
from .result import Candidate, CreditResult
from .ties import same_state_tie_share

__all__ = ["ALGORITHMS", "DROPPABLE", "Candidate", "CreditConfig", "CreditResult", "Rollout", "RolloutBatch",
           "compute_advantages", "same_state_tie_share"]
