"""Crash-safe checkpoints: model/adapter, optimizer/scheduler, RNG states, iteration, sampler state.

Layout of one checkpoint (``<run dir>/checkpoints/iter_000012/``)::

    policy/          policy.save(folder): weights or LoRA adapter + tokenizer
    trainer.pt       PPOUpdater.state_dict() (optimizer, scheduler, counters)
    rng.pt           python / numpy / torch RNG states
    state.json       iteration, task-sampler state, anything JSON the loop adds
    manifest.json    sha256 of every file above (written last)

Writing is atomic: everything goes to a hidden temp folder, each file and folder is fsynced, then
the folder is renamed to its final name (rename is atomic on POSIX) and the parent is fsynced. A
killed writer leaves only a ``.tmp-*`` folder, which is never listed and is swept on the next
save. Loading verifies every hash in the manifest first and refuses a mismatch with
:class:`CheckpointError`; a checkpoint is never partly loaded.

``trainer.pt`` and ``rng.pt`` are read with ``torch.load(weights_only=True)``: tensors, numbers,
strings and plain containers only, plus exactly what numpy's RNG state needs (:data:`_RNG_GLOBALS`),
so a checkpoint someone else wrote cannot run code when it is resumed; anything else (a pickled
callable, say) is refused with :class:`CheckpointError`.

A run's checkpoint folder records the run it belongs to (``owner.json``: its MLflow run id, which
no other run of any store shares): two stores keeping their run 1 in one run folder would otherwise
write, prune and resume each other's checkpoints. :func:`claim_folder` refuses a folder of another
run, and one that holds checkpoints a run starting from iteration 0 did not write.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from milegpo_cli.errors import MilegpoError
from envs.faults import fault_point

try:
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy < 2
    from numpy.core.multiarray import _reconstruct

MANIFEST = "manifest.json"
OWNER = "owner.json"  # in a run's checkpoint folder: {"run": the MLflow run id of the run writing there}
FORMAT = 1
_NAME = re.compile(r"^iter_(\d{6,})$")
# numpy.random.get_state() holds a uint32 ndarray; optimizer and LambdaLR states need nothing beyond torch's defaults
_RNG_GLOBALS = [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


class CheckpointError(MilegpoError, RuntimeError):
    """A checkpoint is missing, incomplete, or fails its integrity check."""


class DiskFull(CheckpointError):
    """A checkpoint could not be written for lack of space; its temp folder is removed, the older
    checkpoints and the store are untouched."""


FULL_BYTES = 1 << 20  # a write that failed with less free space than this failed for lack of space


def _out_of_space(err: BaseException, folder: Path) -> bool:
    """Whether a failed write ran out of space. torch.save and safetensors do not raise OSError
    (RuntimeError "unexpected pos", SafetensorError "os error 28"), so the free space decides too."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if "No space left on device" in str(err) or "os error 28" in str(err):
        return True
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < FULL_BYTES


@dataclass(frozen=True)
class Checkpoint:
    """A verified checkpoint: ``policy_dir`` for Policy.load, the rest already read."""

    path: Path
    iteration: int
    policy_dir: Path
    trainer_state: dict[str, Any]
    rng_state: dict[str, Any]
    state: dict[str, Any]


def checkpoint_name(iteration: int) -> str:
    return f"iter_{iteration:06d}"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root`` (those with a manifest), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        m = _NAME.match(child.name)
        if m and (child / MANIFEST).is_file():
            found.append((int(m.group(1)), child))
    return sorted(found)


def folder_owner(root: str | Path) -> str | None:
    """The run a checkpoint folder belongs to (:data:`OWNER`); None when it records none."""
    file = Path(root) / OWNER
    try:
        return str(json.loads(file.read_text())["run"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{file}: unreadable ({err})") from err
    except RecursionError:
        raise CheckpointError(f"{file}: unreadable (JSON nested too deep)") from None


def _shared_folder(root: Path, what: str) -> CheckpointError:
    """The error of a checkpoint folder that two stores' runs of one id use; ``what`` says how it shows."""
    return CheckpointError(f"{root} {what}: two stores use this run folder for their {root.name}; give each "
                           f"store its own --runs-dir (nothing was changed)")


def check_owner(root: str | Path, owner: str | None) -> None:
    """CheckpointError unless the checkpoint folder ``root`` may be the folder of run ``owner`` (its
    MLflow run id; None: a run that never started, so it wrote no checkpoint). A folder that records
    no owner was written before owners were recorded and is taken as the run's own."""
    root = Path(root)
    recorded = folder_owner(root)
    if recorded is not None and recorded != owner:
        raise _shared_folder(root, f"holds the checkpoints of another run (MLflow run {recorded}, not "
                                   f"{owner or 'this unstarted run'})")
    if owner is None and list_checkpoints(root):
        raise _shared_folder(root, "holds checkpoints, but its run never started")


def _unwritable(root: Path, err: OSError) -> CheckpointError:
    """A checkpoint folder this process cannot write (permissions, an immutable folder, a read-only mount)."""
    return CheckpointError(f"checkpoint folder {root} cannot be written ({err.strerror or err}); the store and the "
                           "earlier checkpoints are intact: make it writable, then resume")


def claim_folder(root: str | Path, owner: str, fresh: bool) -> None:
    """Record run ``owner`` as the owner of its checkpoint folder ``root`` (created if missing), after
    :func:`check_owner`; a run starting from iteration 0 (``fresh``) also refuses checkpoints of a
    folder that records no owner."""
    root = Path(root)
    check_owner(root, owner)
    if fresh and folder_owner(root) is None and list_checkpoints(root):
        raise _shared_folder(root, "holds checkpoints no run of this store wrote (a run starting from iteration 0 "
                                   "has none)")
    tmp = root / f".{OWNER}.{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"run": owner}))
        _fsync_path(tmp)
        tmp.replace(root / OWNER)
        _fsync_path(root)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise _unwritable(root, err) from None


def save_checkpoint(root: str | Path, iteration: int, policy, trainer_state: dict[str, Any],
                    state: dict[str, Any], keep: int) -> Path:
    """Write checkpoint ``iteration`` atomically under ``root``; keep the newest ``keep``. Returns its path."""
    if keep < 1:
        raise CheckpointError(f"checkpoint.keep: must be >= 1, got {keep}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):  # left by a writer that was killed
        shutil.rmtree(stale, ignore_errors=True)
    name = checkpoint_name(iteration)
    tmp = root / f".tmp-{name}-{os.getpid()}"
    try:
        tmp.mkdir()
        policy.save(tmp / "policy")
        torch.save(trainer_state, tmp / "trainer.pt")
        torch.save(rng_state(), tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps({**state, "iteration": iteration}, sort_keys=True))
        fault_point("checkpoint.write")  # test-only: a kill before the manifest (envs/faults.py)
        files = _files(tmp)
        manifest = {"format": FORMAT, "iteration": iteration,
                    "files": {str(p.relative_to(tmp)): sha256_file(p) for p in files}}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    except Exception as err:
        full = _out_of_space(err, root)
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise DiskFull(f"checkpoint of iteration {iteration}: no space left on the device of {root}; the "
                           f"store and the earlier checkpoints are intact: free space, then resume") from None
        if isinstance(err, OSError):
            raise _unwritable(root, err) from None
        raise
    for p in [*files, tmp / MANIFEST]:
        _fsync_path(p)
    for d in sorted({p.parent for p in files} | {tmp}, key=lambda d: -len(d.parts)):
        _fsync_path(d)
    final = root / name
    if final.exists():  # same iteration written again after a resume: replace it
        trash = root / f".tmp-old-{name}-{os.getpid()}"
        final.rename(trash)
        shutil.rmtree(trash)
    tmp.rename(final)
    _fsync_path(root)
    for _, old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def verify_checkpoint(path: str | Path) -> dict[str, Any]:
    """Check every file of a checkpoint against its manifest; return the manifest or raise CheckpointError."""
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        expected = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"checkpoint {path}: unreadable manifest ({err})") from err
    present = {str(p.relative_to(path)) for p in _files(path)}
    if present != set(expected):
        extra, missing = sorted(present - set(expected)), sorted(set(expected) - present)
        raise CheckpointError(f"checkpoint {path}: files do not match the manifest (missing {missing}, extra {extra})")
    for rel, digest in expected.items():
        if sha256_file(path / rel) != digest:
            raise CheckpointError(f"checkpoint {path}: sha256 mismatch for {rel} (file corrupted or modified)")
    return manifest


def _load_state(file: Path) -> Any:
    """``torch.load`` restricted to plain data (module docstring); CheckpointError otherwise."""
    try:
        with torch.serialization.safe_globals(_RNG_GLOBALS):
            return torch.load(file, weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL (\S+)", str(err))  # the callable or class torch refused to import
        why = f"it imports {found.group(1)}" if found else str(err).splitlines()[0]
        raise CheckpointError(f"checkpoint {file.parent}: {file.name} holds more than tensors and plain data, "
                              f"refused ({why})") from err


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Verify, then read a checkpoint (the policy itself is loaded by the caller from ``policy_dir``)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path}: not found")
    manifest = verify_checkpoint(path)
    state = json.loads((path / "state.json").read_text())
    return Checkpoint(
        path=path,
        iteration=int(manifest["iteration"]),
        policy_dir=path / "policy",
        trainer_state=_load_state(path / "trainer.pt"),
        rng_state=_load_state(path / "rng.pt"),
        state=state,
    )


def latest_checkpoint(root: str | Path) -> Checkpoint | None:
    """The newest complete checkpoint under ``root``, verified; None when there is none."""
    found = list_checkpoints(root)
    return load_checkpoint(found[-1][1]) if found else None


def find_checkpoint(root: str | Path, iteration: int | None) -> Checkpoint:
    """Checkpoint ``iteration`` (or the newest when None); CheckpointError naming what exists otherwise."""
    found = dict(list_checkpoints(root))
    if not found:
        raise CheckpointError(f"no checkpoint under {root}")
    if iteration is None:
        iteration = max(found)
    if iteration not in found:
        raise CheckpointError(f"no checkpoint for iteration {iteration} under {root} (have {sorted(found)})")
    return load_checkpoint(found[iteration])
