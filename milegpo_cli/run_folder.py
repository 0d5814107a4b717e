"""A run folder (``--runs-dir``, ``store.root``) can be copied or moved: a stored run is re-rooted on open.

A run's stored config holds the folder it was started in and paths derived from it (the SQLite store,
the MLflow store, the ALFWorld game cache). Opened from another folder, :func:`reroot` moves every
derived path to the folder in use; a path the user set elsewhere (a PostgreSQL URL, an MLflow server,
a shared game cache) stays. Checkpoints live under ``<folder>/checkpoints/run_<id>`` and are stored
relative to the folder, so nothing of the old folder is read or written again (docs/reliability.md).
"""
from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from milegpo_cli.config import Config, default_db_url, default_tracking_uri


def reroot(config: Config, root: str | Path | None) -> Config:
    """``config`` with its run folder at ``root`` (None: unchanged); derived paths follow it."""
    if root is None or str(root) == config.store.root:
        return config
    old, new = config.store.root, str(root)
    store = config.store

    def moved(value: str, old_default: str, new_default: str) -> str:
        return new_default if value == old_default else value

    store = dataclasses.replace(store, root=new, db=moved(store.db, default_db_url(old), default_db_url(new)),
                                mlflow_uri=moved(store.mlflow_uri, default_tracking_uri(old),
                                                 default_tracking_uri(new)))
    alf = config.env.alfworld
    alf = dataclasses.replace(alf, data_dir=moved(alf.data_dir, str(Path(old) / "alfworld"), str(Path(new) / "alfworld")))
    return dataclasses.replace(config, store=store, env=dataclasses.replace(config.env, alfworld=alf))


def command_root(runs_dir: Path | None, db: str | None) -> Path | None:
    """The run folder a command works in: ``--runs-dir`` (or MILEGPO_RUNS_DIR), else ``runs`` when the
    store is the default one; with only ``--db`` given, None (the run's stored folder is kept)."""
    if runs_dir is not None:
        return runs_dir
    return Path("runs") if db is None else None


def resume_command(run_id: int, root: str | Path, store_url: str) -> str:
    """The command line that resumes ``run_id`` of the store at ``store_url`` in folder ``root``
    (absolute; ``--db`` when the store is not the folder's own, its password hidden)."""
    from sqlalchemy.engine import make_url

    parts = ["milegpo", "train", "--resume", str(run_id), "--runs-dir", str(Path(root).resolve())]
    if make_url(store_url) != make_url(default_db_url(root)):
        parts += ["--db", make_url(store_url).render_as_string(hide_password=True)]
    return shlex.join(parts)


def relative_to_folder(path: Path, root: str | Path) -> str:
    """``path`` as stored: relative to the run folder when inside it."""
    try:
        return str(Path(path).resolve().relative_to(Path(root).resolve()))
    except ValueError:
        return str(path)
