"""The verl-agent adapter with ``algo="gigpo"`` against verl-agent's own
``gigpo.core_gigpo.compute_gigpo_outcome_advantage`` on the same tensors (issue 18).

Tensors: the step rows of recorded rollouts (bench/results/rollouts_{alfworld,webshop}.jsonl.gz,
the first --groups groups of each, outcome 10 x success, a tenth of the steps flagged invalid with
verl-agent's penalty 0.1 on their row score and return; a third case adds a group of one one-step
rollout), multi-token
responses right-padded to 32 tokens, rows of different trajectories interleaved; both modes,
exact anchors and similarity grouping; float64 (the 1e-8 check) and float32 (as verl-agent runs).
verl-agent's module imports ``verl.DataProto`` for type hints only: when verl itself does not
import here, a stand-in module is registered (nothing of it is called). Writes
bench/results/verl_agent_parity.json.

    git -C <mirror> archive HEAD gigpo | tar -x -C /tmp/verl-agent      # or any verl-agent checkout
    .venv/bin/python bench/verl_agent_parity.py /tmp/verl-agent [--commit SHA] [--groups 16]
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import importlib
import io
import json
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

from milegpo_cli.credit import Rollout, RolloutBatch
from milegpo_cli.integrations.verl_agent import compute_advantage, rows_from_rollouts
from milegpo_cli.interchange import parse_rollout

RESULTS = Path(__file__).resolve().parent / "results"
SINGLE_NOTE = ("a group with a single step row gets mean 0 and std 1 in both; verl-agent holds that 1 "
               "as a float32 tensor, so in mean_std_norm it divides by float32(1 + epsilon) = 1 + 9.54e-7 "
               "where the adapter divides by 1 + 1e-6: a relative difference of 4.6e-8 on those rows only")
ROW_KEYS = ("token_level_rewards", "step_rewards", "response_mask", "anchor_obs", "index", "traj_index")


def load_verl_agent(checkout: Path):
    sys.path.insert(0, str(checkout))
    try:
        importlib.import_module("verl")
    except Exception:  # noqa: BLE001 - verl needs ray, tensordict, ...; only a type name is used
        sys.modules["verl"] = types.SimpleNamespace(DataProto=object)
    return importlib.import_module("gigpo.core_gigpo")


def rows(env: str, groups: int, seed: int, single: bool) -> dict:
    rollouts, names = [], []
    rng = np.random.default_rng(seed)
    with gzip.open(RESULTS / f"rollouts_{env}.jsonl.gz", "rt") as f:
        for number, line in enumerate(f, start=1):
            r = parse_rollout(line, number)
            if r.group not in names:
                if len(names) == groups:
                    break
                names.append(r.group)
            rollouts.append(Rollout(r.group, r.rollout_id, r.states, r.actions, r.rewards, 10.0 * r.outcome,
                                    invalid=(rng.random(len(r.states)) < 0.1).tolist()))
    if single:
        rollouts.append(Rollout("single", 0, ["s"], ["a"], [10.0], 10.0))
    n = RolloutBatch.from_rollouts(rollouts).num_steps
    out = rows_from_rollouts(rollouts, 0.95, rng.integers(1, 33, n), max_response_length=32, invalid_penalty=0.1)
    pos = rng.permutation(n)  # interleave trajectories, each trajectory's rows kept in step order
    for traj in np.unique(out["traj_index"]):
        at = np.flatnonzero(out["traj_index"] == traj)
        pos[at] = np.sort(pos[at])
    inverse = np.argsort(pos)
    return {k: v[inverse] for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkout", type=Path, help="a verl-agent checkout (needs gigpo/core_gigpo.py)")
    ap.add_argument("--commit", help="the checkout's commit, when it is not a git work tree")
    ap.add_argument("--groups", type=int, default=16)
    args = ap.parse_args()
    ref = load_verl_agent(args.checkout)
    commit = args.commit or subprocess.run(["git", "-C", str(args.checkout), "rev-parse", "HEAD"],
                                           capture_output=True, text=True).stdout.strip() or None
    cases = []
    for env, single in (("alfworld", False), ("webshop", False), ("alfworld", True)):
        base = rows(env, args.groups, seed=0, single=single)
        for dtype in (torch.float64, torch.float32):
            data = {k: (v.to(dtype) if torch.is_tensor(v) else v) for k, v in base.items()}
            for mode in ("mean_norm", "mean_std_norm"):
                for similarity in (False, True):
                    tensors = [data[k] for k in ROW_KEYS]
                    extra = (1e-6, 0.8, mode, similarity, 0.95)
                    t0 = time.perf_counter()
                    with contextlib.redirect_stdout(io.StringIO()):  # it prints group sizes
                        want, want_ret = ref.compute_gigpo_outcome_advantage(*tensors, *extra)
                    t_ref = time.perf_counter() - t0
                    t0 = time.perf_counter()
                    got, got_ret = compute_advantage(*tensors, *extra, algo="gigpo")
                    t_ours = time.perf_counter() - t0
                    diff = float((got.double() - want.double()).abs().max())
                    case = dict(env=env, single_row_group=single, dtype=str(dtype).removeprefix("torch."), mode=mode, similarity=similarity,
                                rows=int(want.shape[0]), tokens=int(data["response_mask"].sum()),
                                max_abs_diff=diff, max_abs_advantage=float(want.abs().max()),
                                returns_equal=bool(torch.equal(got, got_ret) and torch.equal(want, want_ret)),
                                dtype_equal=got.dtype == want.dtype, verl_agent_s=round(t_ref, 4),
                                adapter_s=round(t_ours, 4))
                    cases.append(case)
                    print(json.dumps(case))
    float64 = [c for c in cases if c["dtype"] == "float64" and not c["single_row_group"]]
    summary = dict(verl_agent_commit=commit, groups_per_env=args.groups,
                   max_abs_diff_float64=max(c["max_abs_diff"] for c in float64),
                   max_abs_diff_float32=max(c["max_abs_diff"] for c in cases if c["dtype"] == "float32"),
                   parity_1e8_float64=all(c["max_abs_diff"] <= 1e-8 for c in float64),
                   max_abs_diff_single_row_group_float64=max(
                       c["max_abs_diff"] for c in cases if c["dtype"] == "float64" and c["single_row_group"]),
                   single_row_group_note=SINGLE_NOTE, cases=cases)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "verl_agent_parity.json").write_text(json.dumps(summary, indent=1) + "\n")
    print({k: v for k, v in summary.items() if k != "cases"})


if __name__ == "__main__":
    main()
