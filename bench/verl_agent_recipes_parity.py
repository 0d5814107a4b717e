"""``milegpo credit --algo gigpo|graphgpo|hgpo --set credit.preset="verl-agent"`` against verl-agent's own
code (issue 33): ``gigpo/core_gigpo.py``, ``recipe/GraphGPO/core_graph.py`` and ``recipe/hgpo/core_hgpo.py``,
called as their trainers call them, on generated rollouts. Prints max |dA| per estimator and setting.

Rollouts (``generate``): groups of mixed outcomes, all-fail, all-win, a single rollout, and two states
only (loops, identical rollouts); a fifth of the steps invalid; every failed rollout records its final
state (a state of the group or a dead end). Ours: the rollouts written as a JSON Lines file and run
through ``run_credit_file`` (what ``milegpo credit`` runs). verl-agent's: the step rows its rollout
loops produce (``anchor_obs``, ``next_obs`` = the next observation, ``"success"`` after a win, the
real final observation after a failure; the episode reward 10 x success on the last response token),
step returns from ``compute_step_discounted_returns`` (GiGPO, HGPO; gamma 0.95) or the GraphGPO graph
(``ComplexGraph.from_data``, ``Calculate_all_shortest_path``, ``compute_graph_path_returns``), the
trainers' invalid-action penalty (0.1 off the row's last-token score and its step return), then the
advantage function. Float64: verl-agent's explicit float32 casts are run in float64 (the module's
``np`` / ``torch`` names are replaced by views whose ``float32`` is float64, and torch's default dtype
is float64). verl-agent's modules import ``verl.DataProto`` for type hints only: when verl does not
import here, a stand-in is registered. Nothing of verl-agent is vendored: point at a checkout.

    git clone https://github.com/langfengQ/verl-agent /tmp/verl-agent    # recipe/hgpo since b4918cc,
    .venv/bin/python bench/verl_agent_recipes_parity.py /tmp/verl-agent  # recipe/GraphGPO since 234a913

Measured at 20bd331 (bench/results/verl_agent_recipes_parity.json; --groups 60, --seed 0 the defaults).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import json
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import torch

from milegpo_cli.credit import Rollout
from milegpo_cli.interchange import run_credit_file, write_rollouts

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = ("mixed", "all-fail", "all-win", "singleton", "loops")
PENALTY = 0.1
GAMMA = 0.95
WIDTH = 4  # response tokens per row


def generate(groups: int, seed: int) -> list[Rollout]:
    """Rollouts of ``groups`` groups cycling through KINDS (module docstring)."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(groups):
        kind = KINDS[g % len(KINDS)]
        n_states = 2 if kind == "loops" else int(rng.integers(2, 7))
        size = 1 if kind == "singleton" else int(rng.integers(2, 9))
        for i in range(size):
            if kind == "loops" and i == 1:  # an identical copy of rollout 0
                out.append(Rollout(f"g{g}", i, *[list(x) for x in (out[-1].states, out[-1].actions, out[-1].rewards)],
                                   out[-1].outcome, out[-1].success, list(out[-1].invalid), final_state=out[-1].final_state))
                continue
            length = int(rng.integers(1, 9))
            win = {"all-win": True, "all-fail": False}.get(kind, bool(rng.random() < 0.5))
            states = ["s0"] + [f"s{rng.integers(n_states)}" for _ in range(length - 1)]
            final = None if win else (f"s{rng.integers(n_states)}" if rng.random() < 0.6 else f"dead{rng.integers(2)}")
            out.append(Rollout(f"g{g}", i, states, [f"a{rng.integers(3)}" for _ in range(length)],
                               [0.0] * (length - 1) + [10.0 if win else 0.0], float(win), win,
                               (rng.random(length) < 0.2).tolist(), final_state=final))
    return out


class Float64View(types.ModuleType):
    """``module`` with ``float32`` standing for float64 (verl-agent's casts, run in double precision)."""

    def __init__(self, module, float64):
        super().__init__(module.__name__)
        self._module, self.float32 = module, float64

    def __getattr__(self, name):
        return getattr(self._module, name)


def load(checkout: Path, rel: str, name: str):
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    try:
        importlib.import_module("verl")
    except Exception:  # noqa: BLE001 - verl needs ray, tensordict, ...; only the DataProto name is used
        sys.modules["verl"] = types.SimpleNamespace(DataProto=object)
    spec = importlib.util.spec_from_file_location(name, checkout / rel)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.np, module.torch = Float64View(np, np.float64), Float64View(torch, torch.float64)
    return module


def rows(rollouts: list[Rollout], seed: int) -> types.SimpleNamespace:
    """verl-agent's step rows of ``rollouts`` (trajectories contiguous, in step order) and the batch view."""
    rng = np.random.default_rng(seed + 1)
    nt = {k: [] for k in ("uid", "traj_uid", "anchor_obs", "next_obs", "text_actions", "episode_rewards", "rewards",
                          "active_masks", "is_action_valid")}
    for r in rollouts:
        for t, (s, a, w, bad) in enumerate(zip(r.states, r.actions, r.rewards, r.invalid)):
            last = t == len(r.states) - 1
            nt["uid"].append(r.group)
            nt["traj_uid"].append(f"{r.group}#{r.rollout_id}")
            nt["anchor_obs"].append(s)
            nt["next_obs"].append(r.states[t + 1] if not last else ("success" if r.success else r.final_state))
            nt["text_actions"].append(a)
            nt["episode_rewards"].append(10.0 * r.success)
            nt["rewards"].append(w)
            nt["active_masks"].append(True)
            nt["is_action_valid"].append(not bad)
    nt = {k: np.array(v, dtype=object if k in ("uid", "traj_uid", "anchor_obs", "next_obs", "text_actions") else None)
          for k, v in nt.items()}
    n = len(nt["uid"])
    lengths = rng.integers(1, WIDTH + 1, n)
    mask = torch.as_tensor(np.arange(WIDTH)[None, :] < lengths[:, None], dtype=torch.float64)
    scores = torch.zeros(n, WIDTH, dtype=torch.float64)
    invalid = torch.as_tensor(~nt["is_action_valid"].astype(bool), dtype=torch.float64)
    scores[torch.arange(n), torch.as_tensor(lengths - 1)] = torch.as_tensor(nt["episode_rewards"].astype(float)) - PENALTY * invalid
    data = types.SimpleNamespace(non_tensor_batch=nt, batch={"input_ids": torch.zeros(n, 1)})
    return types.SimpleNamespace(data=data, token_level_rewards=scores, response_mask=mask, invalid=invalid)


def reference(mods: dict, algo: str, rw, **kw) -> np.ndarray:
    """verl-agent's per-row advantage (first response token) for ``algo``."""
    nt = rw.data.non_tensor_batch
    with contextlib.redirect_stdout(io.StringIO()):  # they print
        if algo == "graphgpo":
            graph = mods["graphgpo"]
            gs = graph.ComplexGraph.from_data(rw.data)
            graph.ComplexGraph.Calculate_all_shortest_path(gs)
            step = graph.compute_graph_path_returns(rw.data, gs, kw["gamma_g"], False)
        else:
            step = mods[algo].compute_step_discounted_returns(rw.data, GAMMA)
        step = step - PENALTY * rw.invalid  # the trainers' apply_invalid_action_penalty
        args = (rw.token_level_rewards.clone(), step, rw.response_mask, nt["anchor_obs"], nt["uid"], nt["traj_uid"])
        if algo == "gigpo":
            adv, _ = mods["gigpo"].compute_gigpo_outcome_advantage(*args, 1e-6, 1.0, kw["mode"])
        elif algo == "graphgpo":
            adv, _ = graph.compute_graphgpo_outcome_advantage(*args, epsilon=1e-6, step_advantage_w=1.0,
                                                              episode_advantage_w=1.0, mode=kw["mode"])
        else:
            adv, _ = mods["hgpo"].compute_hgpo_outcome_advantage(
                *args, history_length=kw["history"], epsilon=1e-6, mode=kw["mode"],
                length_weight_alpha=kw["alpha"], base_group=kw["base_group"])
    return adv[:, 0].double().numpy()


def ours(path: Path, algo: str, **kw) -> np.ndarray:
    sets = {"preset": "verl-agent", "episode_norm": {"mean_norm": "mean", "mean_std_norm": "mean_std"}[kw["mode"]]}
    if algo == "graphgpo":
        sets["graph_gamma"] = kw["gamma_g"]
    if algo == "hgpo":
        sets.update(hgpo_history=kw["history"], hgpo_alpha=kw["alpha"], hgpo_base_group=kw["base_group"])
    out = path.with_suffix(f".{algo}.out")
    run_credit_file(path, out, algo, overrides=sets)
    return np.array([json.loads(line)["advantage"] for line in out.read_text().splitlines()])


SETTINGS = ([("gigpo", dict(mode=m)) for m in ("mean_norm", "mean_std_norm")]
            + [("graphgpo", dict(mode=m, gamma_g=g)) for g in (0.1, 0.2) for m in ("mean_norm", "mean_std_norm")]
            + [("hgpo", dict(mode=m, history=h, alpha=a, base_group=b))
               for m in ("mean_norm", "mean_std_norm") for h in (2, 4) for a, b in ((1.0, False), (0.0, False), (1.0, True))])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkout", type=Path, help="a verl-agent checkout with gigpo/ and recipe/GraphGPO, recipe/hgpo")
    ap.add_argument("--commit", help="the checkout's commit, when it is not a git work tree")
    ap.add_argument("--groups", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_default_dtype(torch.float64)  # verl-agent's torch.tensor(1.0) of a single-entry group
    mods = {"gigpo": load(args.checkout, "gigpo/core_gigpo.py", "va_core_gigpo"),
            "graphgpo": load(args.checkout, "recipe/GraphGPO/core_graph.py", "va_core_graph"),
            "hgpo": load(args.checkout, "recipe/hgpo/core_hgpo.py", "va_core_hgpo")}
    mods["graphgpo"].episode_norm_reward = mods["gigpo"].episode_norm_reward  # its own import, in float64 too
    mods["graphgpo"].step_norm_reward = mods["gigpo"].step_norm_reward
    commit = args.commit or subprocess.run(["git", "-C", str(args.checkout), "rev-parse", "HEAD"],
                                           capture_output=True, text=True).stdout.strip() or None
    rollouts = generate(args.groups, args.seed)
    rw = rows(rollouts, args.seed)
    kinds = np.array([KINDS[int(r.group[1:]) % len(KINDS)] for r in rollouts for _ in r.states])
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rollouts.jsonl"
        write_rollouts(path, rollouts)
        for algo, kw in SETTINGS:
            diff = np.abs(ours(path, algo, **kw) - reference(mods, algo, rw, **kw))
            case = dict(algo=algo, **kw, rows=int(diff.size), max_abs_diff=float(diff.max()),
                        by_kind={k: float(diff[kinds == k].max()) for k in KINDS})
            cases.append(case)
            print(json.dumps(case))
    summary = dict(verl_agent_commit=commit, groups=args.groups, seed=args.seed,
                   rollouts=len(rollouts), rows=int(rw.response_mask.shape[0]),
                   max_abs_diff={a: max(c["max_abs_diff"] for c in cases if c["algo"] == a) for a in ("gigpo", "graphgpo", "hgpo")},
                   cases=cases)
    summary["parity_1e8"] = all(v <= 1e-8 for v in summary["max_abs_diff"].values())
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "verl_agent_recipes_parity.json").write_text(json.dumps(summary, indent=1) + "\n")
    print({k: v for k, v in summary.items() if k != "cases"})


if __name__ == "__main__":
    main()
