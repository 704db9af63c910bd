"""The finals a server session owes: the audio kept until each arrives, and the finalize round trips measured.

A final confirms the oldest finalized utterance held for replay; a forced final (``final.forced``, the server's
``max_utterance_s``) cuts the audio it covers from the utterance the server decodes now, so a reconnect replays
only the rest; at the end of the session the service waits for every final owed and reports the audio of those
that never came.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

from loguru import logger

from pipecat_nemotron.runtime.stats import percentile
from pipecat_nemotron.server.protocol import FinalMessage
from pipecat_nemotron.stt.remote.replay import ReplayBuffer

__all__ = ["OwedServerFinals"]


class OwedServerFinals:
    """The replay buffer of a server STT service and what its finals confirm.

    Args:
        replay_max_s: Most audio kept for replay, s.
        replay_preroll_s: Audio kept while the user is not speaking, s.
        final_timeout_s: At the end of a session, how long to wait for the finals owed, s.

    """

    def __init__(self, *, replay_max_s: float, replay_preroll_s: float, final_timeout_s: float) -> None:
        self.replay = ReplayBuffer()
        self.replay_max_s = replay_max_s
        self.replay_preroll_s = replay_preroll_s
        self.final_timeout_s = final_timeout_s
        self._rtts_ms: deque[float] = deque(maxlen=512)

    def finalize_p99_ms(self) -> float | None:
        """p99 of the finalize round trips measured (finalize sent to final received), ms; None before any."""
        return percentile(self._rtts_ms, 99.0) if self._rtts_ms else None

    def trim(self, bytes_per_ms: float, *, user_speaking: bool) -> bool:
        """Bound the buffer: preroll only between turns, ``replay_max_s`` in total; True if audio was dropped."""
        preroll = None if user_speaking else int(self.replay_preroll_s * 1000 * bytes_per_ms)
        limit = int(self.replay_max_s * 1000 * bytes_per_ms)
        return self.replay.trim(preroll_bytes=preroll, max_bytes=limit) > 0

    def confirm(self, msg: FinalMessage, bytes_per_ms: float) -> float | None:
        """Account for a final: a forced one cuts its audio, an ordinary one confirms the oldest finalize.

        Returns:
            The finalize round trip, ms, when it was measured (None for a forced final, or a final that answers
            a finalize sent before this session, or none).

        """
        if msg.forced:  # the turn goes on: a reconnect must not transcribe those words again
            self.replay.cut_oldest(2 * round(msg.utterance_audio_ms * bytes_per_ms / 2))
            return None
        seg = self.replay.confirm()
        if seg is None:
            logger.warning(f"unexpected final for utterance {msg.utterance} (no finalize pending)")
            return None
        if seg.finalize_sent_at is None:
            return None
        self._rtts_ms.append((time.monotonic() - seg.finalize_sent_at) * 1000.0)
        return self._rtts_ms[-1]

    async def wait_owed(self, bytes_per_ms: float, *, connected: bool) -> str | None:
        """Wait up to ``final_timeout_s`` for every final owed.

        Returns:
            None when every final came, else the error to report: the seconds of audio whose finals never came.

        """
        if not self.replay.owes_finals:
            return None
        try:
            await asyncio.wait_for(self.replay.wait_for_finals(), self.final_timeout_s)
        except (asyncio.TimeoutError, TimeoutError):
            lost_s = sum(seg.nbytes for seg in self.replay if seg.finalized) / bytes_per_ms / 1000
            return (
                f"Nemotron ASR: finals still owed {self.final_timeout_s:g} s after the end of the session "
                f"({'connected' if connected else 'disconnected'}); {lost_s:.2f} s of audio lost"
            )
        return None
