"""Seeds of a run: every random draw of iteration i derives from (seed, i) (docs/architecture.md)."""
from __future__ import annotations

import hashlib
import json
import random
from typing import Any

import numpy as np
import torch


def derive_seed(seed: int, *parts: Any) -> int:
    """A 63-bit seed from the run seed and a path of labels (pure: same inputs, same seed)."""
    h = hashlib.sha256(json.dumps([seed, *parts]).encode()).digest()
    return int.from_bytes(h[:8], "little") >> 1


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
