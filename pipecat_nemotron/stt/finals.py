"""The finals an in-process STT session is owed: what the end of the session waits for, and reports if lost."""

from __future__ import annotations

import asyncio
import time
from collections import deque

from loguru import logger

__all__ = ["OwedFinals"]


class OwedFinals:
    """The finalize requests of one stream whose finals have not arrived, each with the audio it covers.

    Finals reach the service by one path, the stream's updates, in the order they were requested: the service
    counts the audio it pushes (:meth:`add_audio`), notes each request (:meth:`finalized`), each final read from
    the updates (:meth:`answered`) and the end of the updates (:meth:`ended`). At the end of the session it
    :meth:`wait` s for the finals still owed and reports what is missing (:meth:`lost_message`).
    """

    def __init__(self) -> None:
        self._owed: deque[float] = deque()
        self._utterance_s = 0.0
        self._ended = False
        self._error: BaseException | None = None
        self._timed_out = False
        self._changed: asyncio.Event | None = None

    def reset(self) -> None:
        """A new stream: nothing owed, no audio counted."""
        self._owed.clear()
        self._utterance_s = 0.0
        self._ended = False
        self._error = None
        self._timed_out = False
        self._notify()

    @property
    def owed(self) -> int:
        """Finals requested and not arrived."""
        return len(self._owed)

    def add_audio(self, seconds: float) -> None:
        """Audio pushed into the open utterance, seconds."""
        self._utterance_s += seconds

    def finalized(self) -> None:
        """The open utterance was finalized: its final is owed for the audio counted since the last one."""
        self._owed.append(self._utterance_s)
        self._utterance_s = 0.0

    def answered(self) -> None:
        """A final (not a forced split) arrived: it answers the oldest request."""
        if self._owed:
            self._owed.popleft()
        self._notify()

    def ended(self, error: BaseException | None = None) -> None:
        """The stream's updates ended (with the error that failed the stream, if one did): nothing more comes."""
        self._ended = True
        self._error = error
        self._notify()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()

    async def wait(self, timeout_s: float, who: object) -> None:
        """Wait up to ``timeout_s`` seconds until every owed final has arrived or the updates ended.

        Args:
            timeout_s: The bound, seconds (0: do not wait).
            who: The service, for the log line.

        """
        owed = len(self._owed)
        if not owed or self._ended:
            return
        self._changed = asyncio.Event()
        started = time.monotonic()
        deadline = started + timeout_s
        while self._owed and not self._ended and (remaining := deadline - time.monotonic()) > 0:
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except (asyncio.TimeoutError, TimeoutError):
                break
        self._changed = None
        self._timed_out = bool(self._owed) and not self._ended
        waited_s = time.monotonic() - started
        if waited_s > 1.0 or self._timed_out:
            logger.warning(
                f"{who}: waited {waited_s:.1f} s at the end of the session for {owed} final(s) the engine was "
                f"still decoding; {owed - len(self._owed)} arrived"
            )

    def lost_message(self, timeout_s: float) -> str | None:
        """What was lost: the finals that never arrived and the seconds of audio they covered; None: none.

        Forgets every request: call it once, when the session has ended.
        """
        lost, self._owed = list(self._owed), deque()
        if not lost:
            return None
        if self._error is not None:
            reason = f"failed: {self._error!r}"
        elif self._timed_out or not self._ended:
            reason = (
                f"the engine was still decoding {timeout_s:g} s (final_timeout_s) after the session ended; give it "
                "more time (final_timeout_s, NEMOTRON_ASR_FINAL_TIMEOUT_S) or CPU (cpu_threads, NEMOTRON_CPU_THREADS)"
            )
        else:
            reason = "the stream was closed before its final"
        return (
            f"{len(lost)} final transcript(s) lost at the end of the session: {sum(lost):.1f} s of audio "
            f"({reason})"
        )
