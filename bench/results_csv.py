"""A bench's results file: one row per run appended to a CSV whose older rows keep their columns."""
from __future__ import annotations

import csv
from pathlib import Path


def append_row(path: Path, row: dict) -> None:
    """Append ``row`` to the CSV at ``path`` (created with its folder); the header is the union of every
    row's columns in first-seen order, so a bench that gained columns still reads its older rows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    if path.exists():
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    fields = list(dict.fromkeys([*(k for r in rows for k in r), *row]))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows([*rows, row])
