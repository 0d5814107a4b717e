"""Credit diagnostics at scale, the evaluation half (docs/algorithms.md, "Choosing the defaults";
issues 9, 10 and 15). The recordings: experiments/credit_recording.py; the page:
experiments/credit_bench_report.py.

Every estimator variant (baselines, MileGPO in both formulations and each single-component
ablation) is recomputed on the *same* rollouts with ``credit.compute_advantages`` and scored as in
``experiments.diagnostics`` (ROC-AUC and sign accuracy against the oracle labels; milestone
precision / recall against the true subgoals via ``diagnostics.milestone_match``), with percentile
bootstrap intervals over groups (``diagnostics.GroupBootstrap``, the same bootstrap as ``diagnose``;
fast enough for 10^5 steps x 15 variants x 1000 resamples). Added here: the share of same-state action pairs with tied step advantages (``credit.same_state_tie_share``)
and a *paired* bootstrap of dAUC = AUC(variant) - AUC(reference) on the same resampled groups.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Iterator, Sequence

import numpy as np

from milegpo_cli.credit import CreditConfig, Rollout, RolloutBatch, compute_advantages, same_state_tie_share
from milegpo_cli.credit.config import COMPONENTS, nest_paper_keys
from milegpo_cli.experiments.credit_recording import CreditBenchError
from milegpo_cli.experiments.diagnostics import GroupBootstrap, entered_keys, milestone_match
from milegpo_cli.experiments.stats import Estimate

V2_AS_MEASURED = {"formulation": "v2", "lambda_p": 2.0, "lambda_m": 0.5, "lambda_t": 0.5, "g_p": 0.0, "g_b": 0.0}
PAPER_ETA = {"alfworld": 0.2, "webshop": 1.0}  # eta per environment (docs/algorithms.md, the paper's construction)



@dataclass(frozen=True)
class Variant:
    """One estimator setting; ``reference``: the variant name its paired dAUC is measured against."""

    name: str
    algo: str
    drop: frozenset = frozenset()
    config: CreditConfig = CreditConfig()
    reference: str | None = None

    @property
    def formulation(self) -> str:
        return self.config.formulation if self.algo == "milegpo" else ""


def default_variants(env: str, config: CreditConfig | None = None, ablations: Sequence[str] = COMPONENTS,
                     candidate: dict | None = None) -> list[Variant]:
    """Baselines, MileGPO v3 (``config``: the recipe's own [credit] settings), v2 at the values it
    was measured with (docs/algorithms.md) and the paper formulation (the paper's eta for ``env``),
    each with its single ablations; ``candidate`` (CreditConfig overrides of v3) adds a row
    ``milegpo[k=v,...]`` paired against GraphGPO, the strongest baseline. MileGPO v3 itself is
    paired against GraphGPO too."""
    base = config or CreditConfig()
    ours = replace(base, formulation="v3")
    v2 = replace(base, **V2_AS_MEASURED)
    paper = replace(base, formulation="paper", paper=replace(base.paper, eta=PAPER_ETA.get(env, base.paper.eta)))
    out = [Variant("grpo", "grpo", config=base), Variant("gigpo", "gigpo", config=base),
           Variant("graphgpo", "graphgpo", config=base, reference="gigpo"),
           Variant("hgpo", "hgpo", config=base, reference="gigpo"),
           Variant("oracle-milestones", "oracle-milestones", config=base, reference="gigpo")]
    for tag, cfg, ref in (("milegpo", ours, "graphgpo"), ("milegpo-v2", v2, "gigpo"), ("milegpo-paper", paper, "gigpo")):
        out.append(Variant(tag, "milegpo", config=cfg, reference=ref))
        out += [Variant(f"{tag}-no-{d}", "milegpo", frozenset({d}), cfg, reference=tag) for d in ablations]
    if candidate:
        label = ",".join(f"{k}={v:g}" for k, v in candidate.items())
        out.append(Variant(f"milegpo[{label}]", "milegpo", config=replace(ours, **candidate), reference="graphgpo"))
    return out


@dataclass(frozen=True, eq=False)
class Recording:
    """A recording flattened for the estimators: rollouts in file order, per-step labels."""

    rollouts: list[Rollout]
    oracle_good: list[bool | None]
    subgoals: list[list[str]]
    p: np.ndarray  # per rollout
    task_type: list[str]  # per rollout
    errors: int  # rollouts that ended on an engine error

    @classmethod
    def from_records(cls, records: Sequence[dict]) -> "Recording":
        rollouts, good, sub, p, tt, errors = [], [], [], [], [], 0
        for r in records:
            steps = r["steps"]
            rollouts.append(Rollout(group=r["group"], rollout_id=r["rollout"], states=[s["state"] for s in steps],
                                    actions=[s["action"] for s in steps], rewards=[s["reward"] for s in steps],
                                    outcome=r["outcome"], success=r["success"],
                                    subgoals=[s["subgoals"] for s in steps], final_state=r.get("final_state"),
                                    task=r.get("task"), iteration=r.get("iteration")))
            good += [s["oracle_good"] for s in steps]
            sub += [s["subgoals"] for s in steps]
            p.append(r["p"])
            tt.append(r["task_type"])
            errors += r.get("error") is not None
        return cls(rollouts, good, sub, np.asarray(p, dtype=float), tt, errors)

    def subset(self, keep: np.ndarray) -> "Recording":
        """The rollouts where ``keep`` (per rollout) is true, with their steps."""
        lengths = [len(r.states) for r in self.rollouts]
        step_keep = np.repeat(np.asarray(keep, bool), lengths)
        idx = np.flatnonzero(keep)
        return Recording([self.rollouts[i] for i in idx], [g for g, k in zip(self.oracle_good, step_keep) if k],
                         [s for s, k in zip(self.subgoals, step_keep) if k], self.p[idx],
                         [self.task_type[i] for i in idx], self.errors)


def evaluate(rec: Recording, variants: Sequence[Variant], *, n_resamples: int = 1000, seed: int = 0,
             with_milestones: bool = True) -> list[dict]:
    """One row per variant: AUC, sign accuracy, milestone precision / recall (MileGPO), tie share,
    dAUC against the variant's reference (paired: the same resampled groups), as flat floats
    (``*_lo`` / ``*_hi``: 95 % interval)."""
    if not rec.rollouts:
        raise CreditBenchError("evaluate: no rollouts")
    batch = RolloutBatch.from_rollouts(rec.rollouts)
    step_group = np.asarray(batch.step_group, dtype=int)
    known = np.array([g is not None for g in rec.oracle_good], dtype=bool)
    good = np.array([bool(g) for g in rec.oracle_good], dtype=bool)
    boot = GroupBootstrap(step_group, good, known, batch.num_groups, n_resamples, seed)
    group_steps = [np.flatnonzero(step_group == g) for g in range(batch.num_groups)]
    entered = entered_keys(batch, rec.rollouts)
    auc_samples: dict[str, tuple[float, np.ndarray]] = {}
    rows = []
    for v in variants:
        t0 = time.perf_counter()
        res = compute_advantages(batch, v.algo, v.config, v.drop)
        credit_s = time.perf_counter() - t0
        auc_samples[v.name] = boot.auc_samples(res.advantage)
        row = {"method": v.name, "algo": v.algo, "formulation": v.formulation, "drop": "+".join(sorted(v.drop)),
               "groups": batch.num_groups, "steps": int(known.sum()), "good_share": float(good[known].mean())}
        row.update(_flat("auc", boot.estimate(*auc_samples[v.name])))
        row.update(_flat("sign_acc", boot.sign_accuracy(res.advantage)))
        precision = recall = None
        row["milestones"] = float("nan")
        if v.algo == "milegpo" and with_milestones:
            found: dict[str, set[str]] = {g: set() for g in batch.group_names}
            for c in res.candidates:
                if c.kind == "milestone" and c.credit > 0:
                    found[c.group].add(c.key)
            m = np.array([astuple_match(milestone_match([entered[j] for j in js], [rec.subgoals[j] for j in js],
                                                        found[batch.group_names[g]]))
                          for g, js in enumerate(group_steps)], dtype=float).reshape(-1, 4)
            precision, recall = boot.ratio(m[:, 1], m[:, 0]), boot.ratio(m[:, 3], m[:, 2])
            row["milestones"] = float(m[:, 0].sum())
        row.update(_flat("ms_precision", precision))
        row.update(_flat("ms_recall", recall))
        row["tie_share"] = same_state_tie_share(batch, res.step_advantage)
        row["reference"] = v.reference or ""
        diff = None
        if v.reference in auc_samples:
            (pa, sa), (pb, sb) = auc_samples[v.name], auc_samples[v.reference]
            diff = boot.estimate(pa - pb, sa - sb)
        row.update(_flat("d_auc", diff))
        row["credit_ms"] = round(1000 * credit_s, 2)
        rows.append(row)
    return rows


def astuple_match(m) -> tuple[int, int, int, int]:
    return (m.discovered, m.true, m.subgoals, m.found)


def _flat(key: str, est: Estimate | None) -> dict:
    if est is None:
        return {key: float("nan"), f"{key}_lo": float("nan"), f"{key}_hi": float("nan")}
    return {key: est.value, f"{key}_lo": est.low, f"{key}_hi": est.high}


def subsets(rec: Recording) -> Iterator[tuple[str, Recording]]:
    """("p=0.25", ...) per behaviour p, ("all", everything), then ("all-fail", the groups in which
    no rollout succeeded) when there are any."""
    for p in sorted(set(rec.p.tolist())):
        yield f"p={p:g}", rec.subset(rec.p == p)
    yield "all", rec
    won: dict[str, bool] = {}
    for r in rec.rollouts:
        won[r.group] = won.get(r.group, False) or bool(r.success)
    all_fail = np.array([not won[r.group] for r in rec.rollouts], dtype=bool)
    if all_fail.any():
        yield "all-fail", rec.subset(all_fail)


def with_value(config: CreditConfig, name: str, value) -> CreditConfig:
    """``config`` with field ``name`` set; ``paper_<name>`` (the grid's name of a paper weight) sets
    that field of ``config.paper`` (``paper_lambda``: ``lambda_``)."""
    if name.startswith("paper_"):
        paper = nest_paper_keys({name: value})["paper"]
        return replace(config, paper=replace(config.paper, **paper))
    return replace(config, **{name: value})


def sweep(rec: Recording, env: str, grid: dict[str, Sequence[float]], *, base: CreditConfig | None = None,
          n_resamples: int = 200, seed: int = 0) -> list[dict]:
    """One-at-a-time sweep of CreditConfig fields for MileGPO (``paper_*`` fields: paper formulation,
    others: v3); each row's dAUC is paired against the same formulation at the base values."""
    base = base or CreditConfig()
    rows = []
    for form in ("v3", "paper"):
        cfg0 = replace(base, formulation=form, paper=replace(base.paper, eta=PAPER_ETA.get(env, base.paper.eta))
                       if form == "paper" else base.paper)
        ref = Variant(f"{form}:base", "milegpo", config=cfg0)
        variants = [ref]
        for field_name, values in grid.items():
            if field_name.startswith("paper_") != (form == "paper") and field_name != "omega":
                continue
            for val in values:
                variants.append(Variant(f"{form}:{field_name}={val:g}", "milegpo",
                                        config=with_value(cfg0, field_name, val), reference=ref.name))
        for row in evaluate(rec, variants, n_resamples=n_resamples, seed=seed, with_milestones=False):
            name = row["method"]
            param, _, value = name.partition(":")[2].partition("=")
            rows.append({"formulation": form, "param": param, "value": float(value) if value else float("nan"),
                         **{k: row[k] for k in ("auc", "auc_lo", "auc_hi", "sign_acc", "tie_share",
                                                "d_auc", "d_auc_lo", "d_auc_hi")}})
    return rows


def paired_difference(rec: Recording, a: Variant, b: Variant, *, n_resamples: int = 1000, seed: int = 0) -> Estimate:
    """dAUC = AUC(a) - AUC(b) on the same rollouts, paired bootstrap over groups."""
    row = evaluate(rec, [b, replace(a, reference=b.name)], n_resamples=n_resamples, seed=seed,
                   with_milestones=False)[1]
    return Estimate(row["d_auc"], row["d_auc_lo"], row["d_auc_hi"])


def recording_summary(rec: Recording) -> list[dict]:
    """Per behaviour p (and all): groups, rollouts, steps, success rate, share of oracle-good steps."""
    out = []
    for name, sub in subsets(rec):
        labels = [g for g in sub.oracle_good if g is not None]
        out.append({"subset": name, "groups": len({r.group for r in sub.rollouts}), "rollouts": len(sub.rollouts),
                    "steps": sum(len(r.states) for r in sub.rollouts),
                    "success_rate": float(np.mean([bool(r.success) for r in sub.rollouts])),
                    "mixed_groups": _mixed_groups(sub.rollouts),
                    "good_share": float(np.mean(labels)) if labels else float("nan"),
                    "unlabelled_steps": len(sub.oracle_good) - len(labels),
                    "task_types": len(set(sub.task_type))})
    return out


def _mixed_groups(rollouts: Sequence[Rollout]) -> int:
    outcomes: dict[str, set[bool]] = {}
    for r in rollouts:
        outcomes.setdefault(r.group, set()).add(bool(r.success))
    return sum(len(v) == 2 for v in outcomes.values())
