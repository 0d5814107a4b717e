"""Process environment variables set for a block (read by the processes it starts and the libraries it calls)."""
from __future__ import annotations

import contextlib
import os
from typing import Iterator


@contextlib.contextmanager
def os_environ(**values: str) -> Iterator[None]:
    """``os.environ`` with ``values`` set inside the block, and as it was afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
