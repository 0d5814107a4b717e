"""Plain records the trainer hands to the store (one per episode and step; the milestone / trap candidates
are the estimators' own ``credit.Candidate``)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepRecord:
    """Step t of an episode: the transition kappa(s_t) --a_t--> and its advantage parts (docs/algorithms.md)."""

    t: int
    state_key: str
    action: str
    reward: float
    advantage: float = 0.0  # A_{i,t} = A^E_i + omega * A^S_{i,t}
    episode_advantage: float = 0.0  # A^E_i
    step_advantage: float = 0.0  # A^S_{i,t} (anchor-normalised return + credit)
    credit: float = 0.0  # c_t, the calibrated credit
    milestone: bool = False  # first entry into a milestone at this step
    trap: bool = False
    progress: int = 0  # +1 progress / -1 none / 0 n/a
    branch: int = 0  # +1 agrees / -1 disagrees / 0 n/a
    unverified: bool = False  # no alternative action observed at this state
    oracle_good: bool | None = None  # oracle label, None when the environment gives none
    subgoals: tuple[str, ...] = ()  # true subgoals newly reached by this step


@dataclass
class EpisodeRecord:
    """One rollout: of a training group (iteration set) or of an evaluation."""

    task_id: str
    split: str
    task_type: str
    group: str  # group key within the iteration (the N rollouts of one task share it)
    index: int  # rollout index within its group
    outcome: float  # R_i in [0, 1]
    success: bool
    length: int
    invalid_count: int = 0
    error: str | None = None  # engine traceback when the episode failed
    steps: list[StepRecord] = field(default_factory=list)
    final_state: str | None = None  # kappa of the state after the last step (None: not recorded)
