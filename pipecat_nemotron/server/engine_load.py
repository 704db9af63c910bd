"""How busy the engine is: the share of recent wall time it spent in model steps (:class:`EngineLoad`).

The server feeds it from an engine step listener; a session's pacer asks it whether the engine has room for a
session that is behind to read faster than real time.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipecat_nemotron.asr import StepStats

__all__ = ["LOAD_WINDOW_S", "SPARE_BUSY_FRACTION", "EngineLoad"]

#: The engine has spare capacity while its model steps took less than this share of the last
#: :data:`LOAD_WINDOW_S`: sessions that are behind may then read faster than real time (``max_speed``).
SPARE_BUSY_FRACTION = 0.5

#: Window over which the engine's busy share is measured, s.
LOAD_WINDOW_S = 1.0



class EngineLoad:
    """The share of recent wall time the engine spent in model steps (a step listener feeds it)."""

    def __init__(self, window_s: float = LOAD_WINDOW_S) -> None:
        self.window_s = window_s
        self._steps: deque[tuple[float, float]] = deque()  # (end time, duration), s
        self._busy_s = 0.0

    def observe_step(self, stats: StepStats) -> None:
        """Engine step listener: record one step's duration."""
        now = time.monotonic()
        duration = stats.step_ms / 1000.0
        self._steps.append((now, duration))
        self._busy_s += duration
        self._expire(now)

    def busy_fraction(self) -> float:
        """Share of the last ``window_s`` spent in model steps, 0 to 1."""
        self._expire(time.monotonic())
        return min(1.0, self._busy_s / self.window_s)

    def spare(self) -> bool:
        """True while the engine's steps took less than :data:`SPARE_BUSY_FRACTION` of the window."""
        return self.busy_fraction() < SPARE_BUSY_FRACTION

    def _expire(self, now: float) -> None:
        while self._steps and self._steps[0][0] < now - self.window_s:
            self._busy_s -= self._steps.popleft()[1]
        if not self._steps:
            self._busy_s = 0.0
