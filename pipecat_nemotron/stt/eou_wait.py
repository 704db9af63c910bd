"""``EouWait``: after a VAD stop, an STT whose turn commit reads ``<EOU>`` finalizes on the model's word, not at once.

A final flushes the utterance: the engine pads the audio it has with silence and decodes to the end. A model that
emits ``<EOU>`` hears that padding as the user having stopped, so a final requested at a VAD stop inside a pause
("what is nine times four ... and what day is it") can carry an ``<EOU>`` the user never earned. Streamed on, the
same model waits for the real audio: an ``<EOU>`` heard there is the model's judgement of the pause.

So at a VAD stop the service keeps streaming and finalizes when the first of these comes:

- the model's ``<EOU>`` (or one came already after the utterance's last words): finalize now;
- the user speaks again: no final; the utterance, and the turn, go on;
- ``wait_s`` without either: finalize, and the turn commit decides as it does without an ``<EOU>`` (hold for
  the fallback silence, or ask Smart Turn).

An ``<EOU>`` that comes after that final, while the commit holds the turn and the user is silent (the model needed
more audio than ``wait_s``), also finalizes: the tokens it emitted since the held final (often the sentence's
punctuation) belong to the turn, and that final commits it. The session's end finalizes what is open on its own
path; :meth:`EouWait.close` only stops the timer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from loguru import logger

__all__ = ["EouWait"]


class _TaskOwner(Protocol):
    """The Pipecat processor methods :class:`EouWait` uses to own its timer task."""

    def create_task(self, coroutine: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any]:
        """Start a task the processor's task manager owns."""
        ...

    async def cancel_task(self, task: asyncio.Task[Any], timeout: float | None = 1.0) -> None:
        """Cancel a task the processor started."""
        ...


class EouWait:
    """The finalize a VAD stop owes, held until the model's ``<EOU>``, the user's speech, or ``wait_s``.

    Args:
        owner: The STT service (owns the timer task).
        wait_s: Longest wait for the ``<EOU>`` after a VAD stop, s (0: finalize at the VAD stop).
        finalize: Ends the utterance (the service's finalize request).

    """

    def __init__(self, owner: _TaskOwner, wait_s: float, finalize: Callable[[], Awaitable[None]]) -> None:
        self._owner = owner
        self.wait_s = wait_s
        self._finalize = finalize
        self._timer: asyncio.Task[None] | None = None
        self._since: float | None = None  # monotonic time of the VAD stop whose finalize is held

    @property
    def pending(self) -> bool:
        """Whether a VAD stop's finalize is held for the ``<EOU>``."""
        return self._since is not None

    async def on_vad_stop(self, eou_seen: bool) -> None:
        """The VAD stopped: finalize now if the ``<EOU>`` came already (or no wait is set), else wait for it."""
        if eou_seen or self.wait_s <= 0:
            await self._finalize()
            return
        if self.pending:  # a second stop without speech between them: the first one's wait still runs
            return
        self._since = time.monotonic()
        self._timer = self._owner.create_task(self._deadline(), name=f"{self._owner}::eou_wait")

    async def finalize_now(self) -> None:
        """The model emitted ``<EOU>``: finalize now (a finalize held for it stops waiting)."""
        if self.pending:
            logger.debug(f"{self._owner}: <EOU> {self._waited_ms():.0f} ms after the VAD stop; finalizing")
        else:
            logger.debug(f"{self._owner}: <EOU> after a held final; finalizing what the model said since")
        await self._stop_timer()
        await self._finalize()

    async def on_speech(self) -> None:
        """The user speaks again: the pause was inside the utterance, which goes on without a final."""
        if not self.pending:
            return
        waited_ms = self._waited_ms()
        await self._stop_timer()
        logger.debug(f"{self._owner}: speech again {waited_ms:.0f} ms after the VAD stop, no <EOU>; utterance goes on")

    async def close(self) -> None:
        """Stop the timer (the session ends; its own finalize covers what is open)."""
        await self._stop_timer()

    async def _deadline(self) -> None:
        await asyncio.sleep(self.wait_s)
        self._timer = None  # this task ends with the finalize below; nothing cancels it from here on
        self._since = None
        logger.debug(f"{self._owner}: no <EOU> {self.wait_s:g} s after the VAD stop; finalizing")
        await self._finalize()

    def _waited_ms(self) -> float:
        return (time.monotonic() - self._since) * 1000.0 if self._since is not None else 0.0

    async def _stop_timer(self) -> None:
        task, self._timer = self._timer, None
        self._since = None
        if task is not None and not task.done() and task is not asyncio.current_task():
            await self._owner.cancel_task(task)
