"""The TTFS p99 the Nemotron STT services announce to Pipecat's turn strategies, from measured finalize times."""

from __future__ import annotations

__all__ = ["NEMOTRON_TTFS_P99", "TTFS_MARGIN", "VAD_STOP_SECS", "ttfs_p99_from_finalize_ms"]

#: VAD silence that ends a user turn, seconds: what Pipecat's built-in TTFS values assume, and the agent's default.
VAD_STOP_SECS = 0.2

#: TTFS p99 used before any finalize time was measured: 0.2 s of VAD stop plus 50 ms, the reference finalize
#: p99 on a GPU (24 ms max measured) with margin, seconds.
NEMOTRON_TTFS_P99 = 0.25

#: Safety factor applied to the measured finalize p99 when deriving ``ttfs_p99_latency``.
TTFS_MARGIN = 1.5

#: Smallest finalize share of the derived TTFS p99, ms.
_TTFS_FLOOR_MS = 20.0


def ttfs_p99_from_finalize_ms(finalize_p99_ms: float | None) -> float:
    """TTFS p99 a service announces, from the p99 of its measured finalize times.

    Args:
        finalize_p99_ms: p99 of the finalize times measured so far, ms (None before the first one).

    Returns:
        ``VAD_STOP_SECS`` plus :data:`TTFS_MARGIN` times ``finalize_p99_ms`` (at least 20 ms), rounded to the
        millisecond, or :data:`NEMOTRON_TTFS_P99` when nothing was measured; seconds.

    """
    if finalize_p99_ms is None:
        return NEMOTRON_TTFS_P99
    return round(VAD_STOP_SECS + max(finalize_p99_ms * TTFS_MARGIN, _TTFS_FLOOR_MS) / 1000.0, 3)
