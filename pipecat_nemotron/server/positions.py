"""Exact audio positions of one session's results (``session_audio_ms`` of partials and finals)."""

from __future__ import annotations

from pipecat_nemotron.asr import ASRStream, Transcript
from pipecat_nemotron.server.protocol import FinalMessage
from pipecat_nemotron.server.protocol_server import words_to_wire


class AudioPositions:
    """Where a session's results are in its audio.

    Finals carry the utterance's exact length (samples), decoded frames only 10 ms resolution, so positions are
    the sum of exact utterance lengths plus the current utterance's decoded frames (no error accumulates over
    utterances).
    """

    def __init__(self) -> None:
        self._base_ms = 0.0
        self._decoded_at_final_ms = 0.0

    def position_ms(self, stream: ASRStream) -> float:
        """Session audio decoded so far, ms: exact up to the last final, then 10 ms resolution."""
        return self._base_ms + max(0.0, stream.audio_seconds * 1000.0 - self._decoded_at_final_ms)

    def final_message(
        self, update: Transcript, stream: ASRStream, word_timings: bool = False
    ) -> FinalMessage:
        """The ``final`` message for ``update``, with its words if ``word_timings``.

        Later positions count from the end of its utterance.
        """
        decoded_ms = stream.audio_seconds * 1000.0
        utterance_ms = max(0.0, decoded_ms - self._decoded_at_final_ms)
        if update.utterance_audio_ms is not None:  # the utterance's exact length (every engine final has it)
            utterance_ms = update.utterance_audio_ms
        self._base_ms += utterance_ms
        # A forced final ends before the audio decoded so far (the speech goes on past its cut).
        self._decoded_at_final_ms = self._decoded_at_final_ms + utterance_ms if update.forced else decoded_ms
        return FinalMessage(
            utterance=update.utterance,
            text=update.text,
            latency_ms=update.latency_ms,
            session_audio_ms=self._base_ms,
            utterance_audio_ms=utterance_ms,
            ttf_ms=update.ttf_ms or 0.0,
            step_ms=update.step_ms,
            words=words_to_wire(update.words) if word_timings else None,
            confidence=update.confidence if word_timings else None,
            forced=True if update.forced else None,
        )
