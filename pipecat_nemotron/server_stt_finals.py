"""The owed finals and the replay buffer of :class:`~pipecat_nemotron.server_stt.NemotronServerSTTService`.

A final confirms the oldest finalized utterance held for replay; a forced final (``final.forced``, the server's
``max_utterance_s``) cuts the audio it covers from the utterance the server decodes now, so a reconnect replays
only the rest; at the end of the session the service waits for every final owed and reports the audio of those
that never came.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from loguru import logger

from pipecat_nemotron.server.protocol import FinalMessage, ReadyMessage
from pipecat_nemotron.stt_replay import ReplayBuffer
from pipecat_nemotron.transcript_result import TranscriptResult

__all__ = ["ServerFinalsMixin"]


class ServerFinalsMixin:
    """Finals and replay-buffer bounds of the server STT service.

    Mixed in before ``NemotronSTTBase``; uses the service's ``_replay``, ``_ready``, ``_finalize_rtts_ms``,
    ``_final_timeout_s``, the replay bounds and ``_finalize``.
    """

    _replay: ReplayBuffer
    _ready: ReadyMessage | None
    _finalize_rtts_ms: deque[float]
    _final_timeout_s: float
    _replay_max_s: float
    _replay_preroll_s: float
    _user_speaking: bool
    if TYPE_CHECKING:  # the service's and NemotronSTTBase's members
        _bytes_per_ms: float
        _settings: Any
        is_usable: bool

        async def _finalize(self) -> None: ...
        async def _push_final(self, result: TranscriptResult, ttf_ms: float, model: str | None) -> bool: ...
        async def _push_forced_final(self, result: TranscriptResult) -> None: ...
        async def push_error(self, error_msg: str) -> None:
            """Pipecat's ``FrameProcessor.push_error``."""

    def _trim_replay(self) -> None:
        """Bound the replay buffer: preroll only between turns, ``replay_max_s`` in total."""
        preroll = None if self._user_speaking else int(self._replay_preroll_s * 1000 * self._bytes_per_ms)
        limit = int(self._replay_max_s * 1000 * self._bytes_per_ms)
        if self._replay.trim(preroll_bytes=preroll, max_bytes=limit) and self._ready is None:
            logger.debug(f"{self}: replay buffer full ({self._replay_max_s:g} s) while disconnected; oldest dropped")

    async def _flush_finals(self) -> None:
        """At the end of the session: finalize an unfinished utterance and wait for every final owed.

        After a permanent refusal (already reported) nothing is owed any more: no session will deliver it.
        """
        if not self.is_usable:
            return
        if self._replay.open_segment.nbytes > 0 and self._ready is not None:
            await self._finalize()
        if self._replay.owes_finals:
            try:
                await asyncio.wait_for(self._replay.wait_for_finals(), self._final_timeout_s)
            except (asyncio.TimeoutError, TimeoutError):
                lost_s = sum(seg.nbytes for seg in self._replay if seg.finalized) / self._bytes_per_ms / 1000
                await self.push_error(
                    f"Nemotron ASR: finals still owed {self._final_timeout_s:g} s after the end of the session "
                    f"({'connected' if self._ready else 'disconnected'}); {lost_s:.2f} s of audio lost"
                )

    async def _on_final(self, msg: FinalMessage) -> None:
        if msg.forced:  # split at the server's longest utterance: the turn goes on, no finalize is answered
            # Its audio leaves the replay buffer: a reconnect must not transcribe those words again.
            cut = 2 * round(msg.utterance_audio_ms * self._bytes_per_ms / 2)
            self._replay.cut_oldest(cut)
            await self._push_forced_final(TranscriptResult.from_message(msg))
            return
        seg = self._replay.confirm()
        if seg is None:
            logger.warning(f"{self}: unexpected final for utterance {msg.utterance} (no finalize pending)")
        elif seg.finalize_sent_at is not None:
            self._finalize_rtts_ms.append((time.monotonic() - seg.finalize_sent_at) * 1000.0)
        if await self._push_final(TranscriptResult.from_message(msg), msg.ttf_ms, self._settings.model):
            rtt = f", round trip {self._finalize_rtts_ms[-1]:.1f} ms" if seg and seg.finalize_sent_at else ""
            logger.info(
                f"{self}: final for utterance {msg.utterance} in {msg.ttf_ms:.1f} ms on the server{rtt} "
                f"({msg.latency_ms} ms mode)"
            )
