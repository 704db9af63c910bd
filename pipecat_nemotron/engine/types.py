"""Results the engine hands to callers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TranscriptUpdate:
    """A change of a stream's transcript.

    Attributes:
        text: The current utterance's text so far (partial) or in full (final).
        is_final: True for the final text of an utterance (after ``finalize()``).
        utterance: 0-based index of the utterance within the stream.
        latency_ms: Latency mode that produced it.
        queue_ms: Time the chunk's audio waited for a model step, ms.
        step_ms: Duration of the batched model step that produced it, ms.
        lag_ms: Time from the chunk's last audio sample arriving to this update, ms.
        ttf_ms: For finals: time from the ``finalize()`` call to the final text, ms.

    """

    text: str
    is_final: bool
    utterance: int
    latency_ms: int
    queue_ms: float = 0.0
    step_ms: float = 0.0
    lag_ms: float = 0.0
    ttf_ms: float | None = None


@dataclass(frozen=True)
class FinalTranscript:
    """The final text of one utterance.

    Attributes:
        text: Final text (empty if nothing was said).
        ttf_ms: Time-to-final: from the ``finalize()`` call to the text being available, ms.
        audio_ms: Audio in the utterance, ms.
        utterance: 0-based index of the utterance within the stream.
        latency_ms: Latency mode that produced it.
        tokens: Token ids of the utterance.

    """

    text: str
    ttf_ms: float
    audio_ms: float
    utterance: int
    latency_ms: int
    tokens: tuple[int, ...] = ()
