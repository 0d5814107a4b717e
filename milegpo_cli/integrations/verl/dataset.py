"""A verl dataset of our tasks: one parquet row per task, naming it for the agent loops.

    python -m milegpo_cli.integrations.verl.dataset alfworld train 64 runs/verl/train.parquet [--seed 0]

Row: ``prompt`` (a one-message chat naming the task; verl's RLHFDataset requires it, the agent
loop builds its own prompts), ``data_source``, ``agent_name`` (``milegpo_<env>``) and ``extra_info``
= ``{"milegpo_split", "milegpo_index", "milegpo_seed", "index"}``; the agent loop draws the task as
``suite.tasks(split, 1, seed, start=index)``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ENVS = ("alfworld", "webshop")


def task_rows(env: str, split: str, n: int, seed: int = 0) -> list[dict]:
    return [{"data_source": f"milegpo_{env}", "agent_name": f"milegpo_{env}",
             "prompt": [{"role": "user", "content": f"{env} {split} task {i} (seed {seed})"}],
             "extra_info": {"milegpo_split": split, "milegpo_index": i, "milegpo_seed": seed, "index": i}}
            for i in range(n)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m milegpo_cli.integrations.verl.dataset",
                                     description="Write a verl parquet dataset of milegpo tasks.")
    parser.add_argument("env", choices=ENVS)
    parser.add_argument("split")
    parser.add_argument("n", type=int)
    parser.add_argument("output", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error(f"n: must be >= 1, got {args.n}")
    import pyarrow as pa
    import pyarrow.parquet as pq

    args.output.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(task_rows(args.env, args.split, args.n, args.seed)), args.output)
    print(f"{args.output}: {args.n} {args.env} {args.split} tasks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
