"""The finals an in-process STT session is owed: what the end of the session waits for, and reports if lost."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from loguru import logger

__all__ = ["OwedFinals"]


class OwedFinals:
    """The finalize requests of one stream whose finals have not arrived, each with the audio it covers.

    The service counts the audio it pushes (:meth:`add_audio`) and hands each finalize future to
    :meth:`finalized`; at the end of the session it :meth:`wait` s for them and reports what is still missing
    (:meth:`lost_message`). Finals arrive through the stream's updates; the futures only say when.
    """

    def __init__(self) -> None:
        self._owed: list[tuple[asyncio.Future[Any], float]] = []
        self._utterance_s = 0.0
        # Finals still being decoded when the end of the session stopped waiting (closing the stream then
        # fails them: that failure is not why they were lost).
        self._timed_out: set[asyncio.Future[Any]] = set()

    def reset(self) -> None:
        """A new stream: nothing owed, no audio counted."""
        self._owed.clear()
        self._utterance_s = 0.0
        self._timed_out.clear()

    def add_audio(self, seconds: float) -> None:
        """Audio pushed into the open utterance, seconds."""
        self._utterance_s += seconds

    def finalized(self, future: asyncio.Future[Any]) -> None:
        """The open utterance was finalized: its final (``future``) is owed for the audio counted since the last."""
        self._owed = [(f, s) for f, s in self._owed if not f.done()]
        self._owed.append((future, self._utterance_s))
        self._utterance_s = 0.0

    async def wait(self, timeout_s: float, who: object) -> None:
        """Wait up to ``timeout_s`` seconds until every owed final is decoded, or failed (nothing more will come).

        Args:
            timeout_s: The bound, seconds (0: do not wait).
            who: The service, for the log line.

        """
        owed = [f for f, _ in self._owed if not f.done()]
        if not owed:
            return
        started = time.monotonic()
        done, pending = await asyncio.wait(owed, timeout=timeout_s) if timeout_s > 0 else (set(), set(owed))
        self._timed_out = pending
        waited_s = time.monotonic() - started
        if waited_s > 1.0 or pending:
            logger.warning(
                f"{who}: waited {waited_s:.1f} s at the end of the session for {len(owed)} final(s) the engine was "
                f"still decoding; {len(done)} arrived"
            )

    def lost_message(self, timeout_s: float) -> str | None:
        """What was lost: the finals never decoded (or failed) and the seconds of audio they covered; None: none.

        Forgets every request: call it once, when the session has ended.
        """
        owed, self._owed = self._owed, []
        timed_out, self._timed_out = self._timed_out, set()
        lost = [(f, s) for f, s in owed if not f.done() or f.cancelled() or f.exception() is not None]
        if not lost:
            return None
        lost_s = sum(s for _, s in lost)
        reasons = []
        if any(f in timed_out or not f.done() for f, _ in lost):
            reasons.append(
                f"the engine was still decoding {timeout_s:g} s (final_timeout_s) after the session ended; give it "
                "more time (final_timeout_s, NEMOTRON_ASR_FINAL_TIMEOUT_S) or CPU (cpu_threads, NEMOTRON_CPU_THREADS)"
            )
        failed = [f for f, _ in lost if f.done() and f not in timed_out]
        if failed:
            causes = sorted({"cancelled" if f.cancelled() else repr(f.exception()) for f in failed})
            reasons.append(f"failed: {', '.join(causes)}")
        return (
            f"{len(lost)} final transcript(s) lost at the end of the session: {lost_s:.1f} s of audio "
            f"({'; '.join(reasons)})"
        )
