"""The binomial interval every layer prints (trainer logs, `runs show`, reports): torch-free, so
lower layers and the CLI's fast paths can both import it."""
from __future__ import annotations

from milegpo_cli.errors import MilegpoError


def wilson_interval(successes: float, n: int, confidence: float = 0.95) -> tuple[float, float] | None:
    """Wilson score interval of a binomial proportion (successes of n episodes); None when n = 0.

    (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n), p = successes / n
    (``scipy.stats.binomtest(...).proportion_ci(method="wilson")``).
    """
    from scipy import stats

    if n <= 0:
        return None
    successes = int(round(successes))
    if not 0 <= successes <= n:
        raise MilegpoError(f"wilson_interval: successes must be in [0, {n}], got {successes}")
    ci = stats.binomtest(successes, int(n)).proportion_ci(confidence, method="wilson")
    return float(ci.low), float(ci.high)
