"""The package's one percentile (NumPy's default interpolation), in plain Python.

The ASR engine's step statistics, the STT services' TTFS estimate and the latency observers all use it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["percentile"]


def percentile(values: Sequence[float], q: float) -> float:
    """Percentile with linear interpolation between order statistics (NumPy's default).

    Args:
        values: Samples; at least one.
        q: Percentile in [0, 100].

    Returns:
        The interpolated percentile.

    Raises:
        ValueError: If ``values`` is empty or ``q`` is out of range.

    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
