"""The run store: SQLAlchemy models and repository (SQLite by default) and MLflow tracking."""
from milegpo_cli.store.records import EpisodeRecord, StepRecord
from milegpo_cli.store.repo import RUN_STATUSES, RunStore

__all__ = ["RunStore", "RUN_STATUSES", "EpisodeRecord", "StepRecord"]
