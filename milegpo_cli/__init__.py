"""milegpo: MileGPO / GiGPO / GRPO credit assignment for long-horizon LLM agents."""

import os as _os

# Torch's OpenMP (GNU libgomp in the CPU wheels) reads these once, when torch is first imported:
# threads that wait sleep instead of spinning on a core another process needs (docs/performance.md,
# "Cores on a shared machine"). A value already set in the environment wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
