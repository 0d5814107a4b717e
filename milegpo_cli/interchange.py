"""The JSON Lines rollout interchange format (docs/rollouts.md) and ``milegpo credit``'s core.

Input, one rollout per line:
    {"group": str, "rollout": int|str, "outcome": float, "success": bool (optional), "final_state": str (optional),
     "task": str (optional), "iteration": int >= 0 (optional, needs "task"),
     "steps": [{"state": str, "action": str, "reward": float (optional, default 0),
                "invalid": bool (optional, default false), "subgoals": [str, ...] (optional)}, ...]}
A file may be gzip-compressed (recognised by its first bytes, whatever its name).
Output, one line per step:
    {"group", "rollout", "t", "advantage", "episode_advantage", "step_advantage", "credit", "milestone", "trap"}
"""
from __future__ import annotations

import contextlib
import gzip
import json
import math
import shutil
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Iterable, Iterator

from .credit import CreditConfig, Rollout, RolloutBatch, compute_advantages
from .credit.config import canonical_drop
from .credit.registry import ESTIMATORS
from .credit.result import Candidate, CreditResult
from .errors import ConfigError, MilegpoError
from .outputs import OutputFile, write_together


# estimators whose step advantage uses the step rewards, and what all-zero rewards leave of them
ZERO_REWARDS = {"gigpo": "GiGPO's step returns are all 0, so it equals GRPO",
                "milegpo": "MileGPO's step returns are all 0, only its milestone / trap credit is left per step",
                "hgpo": "HGPO's step returns are all 0, so its advantages are 0 (but for invalid-action penalties)"}


NEEDS_SUBGOALS = ("oracle-milestones",)  # estimators that read steps[t].subgoals
GZIP_MAGIC = b"\x1f\x8b"


def zero_rewards_warning(algo: str) -> str:
    return (f"every step reward is 0: {ZERO_REWARDS[algo]}; put the episode's reward on its last step "
            "(steps[-1].reward, docs/rollouts.md)")


class InterchangeError(MilegpoError, ValueError):
    """A malformed interchange line; names the line number and the field."""

    def __init__(self, line: int, field: str, reason: str):
        super().__init__(f"line {line}, field {field!r}: {reason}")
        self.line, self.field, self.reason = line, field, reason


def _number(value, line: int, field: str) -> float:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > sys.float_info.max:
        raise InterchangeError(line, field, f"must be a finite number, got an integer of {len(str(abs(value)))} digits")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InterchangeError(line, field, f"must be a finite number, got {value!r}")
    return float(value)


def _string(value, line: int, field: str) -> str:
    if not isinstance(value, str):
        raise InterchangeError(line, field, f"must be a string, got {value!r}")
    return value


def _invalid(steps: list, line: int) -> list[bool] | None:
    """``steps[t].invalid``: None when no step has it; a step without it is valid (absent = false)."""
    if not any("invalid" in step for step in steps):
        return None
    return [_bool(step.get("invalid", False), line, f"steps[{t}].invalid") for t, step in enumerate(steps)]


def _per_step(steps: list, key: str, parse, line: int) -> list | None:
    """The optional per-step field ``key`` of a rollout: parsed on every step, or None when no step
    has it (zero steps: an empty list); a rollout that gives it on some steps only is an error
    (``subgoals``: a step without it is not a step that reached none)."""
    missing = [t for t, step in enumerate(steps) if key not in step]
    if len(missing) == len(steps) and steps:
        return None
    if missing:
        raise InterchangeError(line, f"steps[{missing[0]}].{key}", "missing (given on other steps of this rollout)")
    return [parse(step[key], line, f"steps[{t}].{key}") for t, step in enumerate(steps)]


def _bool(value, line: int, field: str) -> bool:
    if not isinstance(value, bool):
        raise InterchangeError(line, field, f"must be true or false, got {value!r}")
    return value


def _subgoals(value, line: int, field: str) -> list[str]:
    if not isinstance(value, list):
        raise InterchangeError(line, field, f"must be a list of strings, got {value!r}")
    return [sys.intern(_string(g, line, f"{field}[{j}]")) for j, g in enumerate(value)]


def parse_rollout(text: str, line: int) -> Rollout:
    """One input line -> Rollout (unknown keys are ignored)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise InterchangeError(line, "<json>", f"invalid JSON ({e.msg.removesuffix(' at')} at column {e.colno})") from None
    except ValueError as e:  # an integer of more than sys.get_int_max_str_digits() digits
        raise InterchangeError(line, "<json>", f"unreadable JSON ({str(e).split(':')[0]})") from None
    except RecursionError:  # json's own limit (about 1,000 levels at Python's default recursion limit)
        raise InterchangeError(line, "<json>", "nested too deep") from None
    if not isinstance(obj, dict):
        raise InterchangeError(line, "<json>", "expected a JSON object")
    for key in ("group", "rollout", "outcome", "steps"):
        if key not in obj:
            raise InterchangeError(line, key, "missing")
    rid = obj["rollout"]
    if isinstance(rid, bool) or not isinstance(rid, (int, str)):
        raise InterchangeError(line, "rollout", f"must be an integer or a string, got {rid!r}")
    success = obj.get("success")
    if success is not None:
        _bool(success, line, "success")
    final_state = obj.get("final_state")
    if final_state is not None:
        final_state = sys.intern(_string(final_state, line, "final_state"))
    task, iteration = _task_order(obj, line)
    steps = obj["steps"]
    if not isinstance(steps, list):
        raise InterchangeError(line, "steps", "must be a list")
    states, actions, rewards = [], [], []
    for t, step in enumerate(steps):
        if not isinstance(step, dict):
            raise InterchangeError(line, f"steps[{t}]", "must be an object")
        for key in ("state", "action"):
            if key not in step:
                raise InterchangeError(line, f"steps[{t}].{key}", "missing")
        # interned: the states and actions of a group repeat, one copy of each is held
        states.append(sys.intern(_string(step["state"], line, f"steps[{t}].state")))
        actions.append(sys.intern(_string(step["action"], line, f"steps[{t}].action")))
        rewards.append(_number(step.get("reward", 0.0), line, f"steps[{t}].reward"))
    return Rollout(group=_string(obj["group"], line, "group"), rollout_id=rid, states=states, actions=actions,
                   rewards=rewards, outcome=_number(obj["outcome"], line, "outcome"), success=success,
                   invalid=_invalid(steps, line),
                   subgoals=_per_step(steps, "subgoals", _subgoals, line), final_state=final_state,
                   task=task, iteration=iteration)


def _task_order(obj: dict, line: int) -> tuple[str | None, int | None]:
    """The optional ``task`` (string) and ``iteration`` (integer >= 0; needs a task). A task without an
    iteration is kept but gives no order, so the memory does not use it (credit/memory.py)."""
    task, iteration = obj.get("task"), obj.get("iteration")
    if task is None:
        if iteration is not None:
            raise InterchangeError(line, "task", "missing (given with iteration)")
        return None, None
    task = sys.intern(_string(task, line, "task"))
    if iteration is not None and (isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0):
        raise InterchangeError(line, "iteration", f"must be an integer >= 0, got {iteration!r}")
    return task, iteration


STDIN = "-"  # the input path that reads standard input
MAX_LINE_BYTES = 64 * 2**20  # one input line, after gunzipping (docs/rollouts.md, "Limits")


def _opened(path: str | Path):
    """The input as a binary stream: standard input for ``-``, else the file (a pipe or FIFO too);
    one that cannot be opened (missing, a folder, unreadable) is a one-line error."""
    if str(path) == STDIN:
        return contextlib.nullcontext(sys.stdin.buffer)
    try:
        return open(path, "rb")
    except OSError as err:
        raise MilegpoError(f"input {path}: cannot be read ({err.strerror})") from None


def _bounded_lines(f) -> Iterator[bytes]:
    """The lines of binary stream ``f``; a line longer than ``MAX_LINE_BYTES`` is an error naming it,
    read no further than the limit (a gzip bomb of one endless line stops there)."""
    for number in range(1, sys.maxsize):
        line = f.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if len(line) > MAX_LINE_BYTES:
            raise InterchangeError(number, "<line>", f"longer than {MAX_LINE_BYTES // 2**20} MiB")
        yield line


def _raw_lines(path: str | Path) -> Iterator[bytes]:
    """The lines of a file (``-``: standard input), gunzipped when it starts with gzip's magic bytes;
    damaged gzip data is an error naming the line it cuts."""
    with _opened(path) as raw:
        if raw.peek(2)[:2] != GZIP_MAGIC:
            yield from _bounded_lines(raw)
            return
        with gzip.GzipFile(fileobj=raw) as f:
            lines = _bounded_lines(f)
            for number in range(1, sys.maxsize):
                try:
                    line = next(lines, b"")
                except (OSError, EOFError, zlib.error) as e:
                    raise InterchangeError(number, "<gzip>", f"damaged gzip data ({e})") from None
                if not line:
                    return
                yield line


def iter_rollouts(path: str | Path) -> Iterator[tuple[int, Rollout]]:
    """Stream (line number, Rollout) from a JSONL file (or a gzipped one), one line in memory at a
    time; blank lines are skipped. Bytes are decoded per line, so a non-UTF-8 byte is an error
    naming its line."""
    for number, raw in enumerate(_raw_lines(path), start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InterchangeError(number, "<utf-8>", f"invalid UTF-8 byte at column {e.start + 1}") from None
        if text.strip():
            yield number, parse_rollout(text, number)


def check_rollouts(path: str | Path) -> int:
    """Validate a whole file, streaming (memory: one line + the (group, rollout) keys); returns the
    number of rollouts. A repeated (group, rollout) is an error naming its line."""
    seen: set = set()
    for number, r in iter_rollouts(path):
        if (r.group, r.rollout_id) in seen:
            raise InterchangeError(number, "rollout", f"duplicate rollout {r.rollout_id!r} in group {r.group!r}")
        seen.add((r.group, r.rollout_id))
    return len(seen)


@contextlib.contextmanager
def seekable(path: str | Path) -> Iterator[str | Path]:
    """``path`` itself when it is a regular file; otherwise (``-``, a pipe, a FIFO, a process
    substitution) a temporary copy of what it gives, so that it can be read twice (removed after)."""
    if str(path) != STDIN and Path(path).is_file():
        yield path
        return
    with _opened(path) as src, tempfile.NamedTemporaryFile(prefix="milegpo-input-", suffix=".jsonl") as copy:
        try:
            shutil.copyfileobj(src, copy, 2**20)
            copy.flush()
        except OSError as err:
            raise MilegpoError(f"input {path}: cannot be copied to {tempfile.gettempdir()} "
                               f"({err.strerror}); set TMPDIR to a folder with room") from None
        yield copy.name


def read_rollouts(path: str | Path) -> list[Rollout]:
    """All rollouts of a file, read only once :func:`check_rollouts` passed: a bad line anywhere
    fails before anything is held in memory (a pipe is copied first: :func:`seekable`)."""
    with seekable(path) as file:
        check_rollouts(file)
        return [r for _, r in iter_rollouts(file)]


def rollout_line(r: Rollout) -> str:
    obj = {"group": r.group, "rollout": r.rollout_id, "outcome": float(r.outcome)}
    if r.success is not None:
        obj["success"] = bool(r.success)
    if r.final_state is not None:
        obj["final_state"] = r.final_state
    if r.task is not None:
        obj["task"] = r.task
    if r.iteration is not None:
        obj["iteration"] = int(r.iteration)
    obj["steps"] = steps = [{"state": s, "action": a, "reward": float(w)}
                            for s, a, w in zip(r.states, r.actions, r.rewards)]
    if r.invalid is not None:
        for step, bad in zip(steps, r.invalid, strict=True):
            step["invalid"] = bool(bad)
    if r.subgoals is not None:
        for step, reached in zip(steps, r.subgoals, strict=True):
            step["subgoals"] = list(reached)
    return json.dumps(obj, allow_nan=False)


def write_rollouts(path: str | Path, rollouts: Iterable[Rollout]) -> None:
    """Write rollouts as JSON Lines (outputs.py: a temporary file renamed into place, a symlink's
    target, a FIFO written directly)."""
    OutputFile(path, "output").write(rollout_line(r) for r in rollouts)


def step_lines(batch: RolloutBatch, result: CreditResult) -> Iterator[str]:
    """One output JSON line per step, in input order."""
    for i in range(batch.num_steps):
        r = int(batch.step_rollout[i])
        yield json.dumps({
            "group": batch.group_names[batch.rollout_group[r]], "rollout": batch.rollout_ids[r],
            "t": int(batch.step_t[i]), "advantage": float(result.advantage[i]),
            "episode_advantage": float(result.episode_advantage[i]),
            "step_advantage": float(result.step_advantage[i]), "credit": float(result.credit[i]),
            "milestone": bool(result.milestone[i]), "trap": bool(result.trap[i]),
        }, allow_nan=False)


def _finite_or_none(x: float):
    return x if math.isfinite(x) else None


def candidate_dict(c: Candidate) -> dict:
    """JSON form of a candidate (inf distance and NaN shares become null)."""
    return {"group": c.group, "key": c.key, "kind": c.kind, "n_pos": c.n_pos, "n_neg": c.n_neg,
            "rho": c.rho, "distance": _finite_or_none(c.distance), "progress_ok": _finite_or_none(c.progress_ok),
            "branch_ok": _finite_or_none(c.branch_ok), "credit": c.credit}


def _missing_subgoals(path: str | Path, algo: str) -> None:
    """Raise the error naming the first line whose rollout has steps but no ``subgoals``."""
    for number, r in iter_rollouts(path):
        if r.subgoals is None:
            raise InterchangeError(number, "steps[0].subgoals", f"missing: --algo {algo} needs the true subgoals "
                                   "newly reached at every step (docs/rollouts.md)")


def credit_config(overrides: dict) -> CreditConfig:
    """CreditConfig from ``{key: value}``; keys may carry the ``credit.`` prefix of ``--set``."""
    return CreditConfig.from_dict({k.removeprefix("credit."): v for k, v in overrides.items()})


def _check_estimator(algo: str, drop: Iterable[str]) -> None:
    if algo not in ESTIMATORS:
        raise ConfigError(f"--algo: unknown estimator {algo!r} (allowed: {', '.join(ESTIMATORS)})")
    try:
        canonical_drop(drop)
    except ValueError as e:
        raise ConfigError(f"--{e}") from None


def run_credit_file(input_path: str | Path, output_path: str | Path, algo: str, drop: Iterable[str] = (),
                    overrides: dict | None = None, milestones_path: str | Path | None = None) -> dict:
    """Read rollouts, compute ``algo``'s advantages, write per-step lines (and candidate sets).

    The outputs are checked before any work (outputs.py: not the input, not each other, writable);
    nothing is written unless every step succeeds. Returns a summary dict; its "warnings" (when
    present) name inputs that make the estimator degenerate (all step rewards 0).
    """
    config = credit_config(overrides or {})
    _check_estimator(algo, drop)
    source = None if str(input_path) == STDIN else input_path
    out = OutputFile(output_path, "-o", {"the input": source})
    ms = None if milestones_path is None else OutputFile(milestones_path, "--milestones",
                                                         {"the input": source, "-o": output_path})
    with seekable(input_path) as file:
        rollouts = read_rollouts(file)
        if algo in NEEDS_SUBGOALS and any(r.subgoals is None for r in rollouts):
            _missing_subgoals(file, algo)
    batch = RolloutBatch.from_rollouts(rollouts, success_threshold=config.success_threshold)
    result = compute_advantages(batch, algo, config, drop=frozenset(drop))
    outputs = [(out, step_lines(batch, result))]
    if ms is not None:
        doc = json.dumps({"algo": algo, "formulation": config.formulation, "drop": sorted(set(drop) | set(config.drop)),
                          "candidates": [candidate_dict(c) for c in result.candidates]}, allow_nan=False, indent=1)
        outputs.append((ms, [doc]))
    write_together(outputs)
    summary = {"groups": batch.num_groups, "rollouts": batch.num_rollouts, "steps": batch.num_steps,
               "milestones": sum(c.kind == "milestone" for c in result.candidates),
               "traps": sum(c.kind == "trap" for c in result.candidates)}
    if algo in ZERO_REWARDS and batch.num_steps and not batch.reward.any():
        summary["warnings"] = [zero_rewards_warning(algo)]
    return summary
