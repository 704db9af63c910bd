"""Results the engine hands to callers."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WordTiming:
    """One recognised word: its text, where it lies in the audio, and how sure the model was of it.

    Times come from the encoder frames at which the greedy RNNT decoder emitted the word's tokens (80 ms
    frames for the Nemotron models), shifted by a constant measured on speech (see ``docs/TRANSCRIPTS.md``):
    they are accurate to about one frame, not to the sample.

    Attributes:
        text: The word, as it appears in the transcript text.
        start_ms: Start of the word, ms from the stream's first sample.
        end_ms: End of the word, ms from the stream's first sample.
        utterance_start_ms: Start of the word, ms from the start of its utterance (the previous final's
            boundary, or the stream's first sample for the first utterance).
        utterance_end_ms: End of the word, ms from the start of its utterance.
        confidence: How sure the model is of the word, in [0, 1] (the lowest confidence of its tokens, each
            the normalised Tsallis entropy of the decoder's output distribution where the token was emitted;
            1 = certain).

    """

    text: str
    start_ms: float
    end_ms: float
    utterance_start_ms: float
    utterance_end_ms: float
    confidence: float


@dataclass(frozen=True)
class TranscriptUpdate:
    """A change of a stream's transcript.

    Attributes:
        text: The current utterance's text so far (partial) or in full (final).
        is_final: True for the final text of an utterance (after ``finalize()``).
        utterance: 0-based index of the utterance within the stream.
        latency_ms: Latency mode that produced it.
        language: Language prompt the model decoded with (a locale such as ``"es-ES"``, or ``"auto"``); None
            on a model without language prompts (the English model).
        detected_language: On the final of an utterance decoded with ``"auto"``: the model's locale whose prompt
            explains the words best (see :mod:`~pipecat_nemotron.asr.language_id`); None otherwise.
        queue_ms: Time the chunk's audio waited for a model step, ms.
        step_ms: Duration of the batched model step that produced it, ms.
        lag_ms: Time from the chunk's last audio sample arriving to this update, ms.
        ttf_ms: For finals: time from the ``finalize()`` call to the final text, ms.
        words: The words of ``text`` with their timings and confidence (on partials, the last word may
            still grow).
        confidence: Confidence of the whole text so far, in [0, 1] (mean of the words'); None when empty.
        start_ms: Where the utterance starts, ms from the stream's first sample.
        utterance_audio_ms: On finals: audio in the utterance, ms (``start_ms + utterance_audio_ms`` is where the
            next one starts). The server's ``final`` message carries it under the same name.
        tokens: On finals: token ids of the utterance.
        forced: On finals: the utterance reached ``EngineConfig.max_utterance_s`` and was split without a
            ``finalize()`` (see :mod:`~pipecat_nemotron.asr.splits`): the speech goes on in the next
            utterance, no finalize request is answered by it, and ``ttf_ms`` is None.

    """

    text: str
    is_final: bool
    utterance: int
    latency_ms: int
    language: str | None = None
    detected_language: str | None = None
    queue_ms: float = 0.0
    step_ms: float = 0.0
    lag_ms: float = 0.0
    ttf_ms: float | None = None
    words: tuple[WordTiming, ...] = ()
    confidence: float | None = None
    start_ms: float = 0.0
    utterance_audio_ms: float | None = None
    tokens: tuple[int, ...] = ()
    forced: bool = False

    @property
    def audio_ms(self) -> float | None:
        """Deprecated name of :attr:`utterance_audio_ms` (on the wire, ``audio_ms`` is the session's position)."""
        warnings.warn("TranscriptUpdate.audio_ms is now utterance_audio_ms", DeprecationWarning, stacklevel=2)
        return self.utterance_audio_ms


#: The name of 0.1's final record. ``finalize()`` resolves with the final :class:`TranscriptUpdate` itself, the same
#: object the stream's ``updates()`` deliver, so a final has one record from the engine to the frame.
FinalTranscript = TranscriptUpdate


@dataclass(frozen=True)
class PeekTranscript:
    """The text an utterance would end with if it ended now: :meth:`ASRStream.peek`'s result.

    Attributes:
        text: What ``finalize()`` would return for the audio received up to the peek (empty if nothing).
        utterance: 0-based index of the utterance within the stream (it goes on after the peek).
        utterance_audio_ms: Audio of the utterance the peek covers, ms (as on finals).
        latency_ms: Latency mode that produced it.
        peek_ms: From the ``peek()`` call to the text being available, ms.
        tokens: Token ids of ``text``.
        language: Language prompt the model decoded with (a locale such as ``"es-ES"``, or ``"auto"``); None
            on a model without language prompts (the English model).

    """

    text: str
    utterance: int
    utterance_audio_ms: float
    latency_ms: int
    peek_ms: float
    tokens: tuple[int, ...] = ()
    language: str | None = None

    @property
    def audio_ms(self) -> float:
        """Deprecated name of :attr:`utterance_audio_ms`."""
        warnings.warn("PeekTranscript.audio_ms is now utterance_audio_ms", DeprecationWarning, stacklevel=2)
        return self.utterance_audio_ms


@dataclass(frozen=True)
class EngineInfo:
    """Facts about a started engine.

    Attributes:
        model: Model path or id.
        device: Device the model runs on (e.g. ``"cuda:0"``, ``"cpu"``).
        dtype: Encoder dtype name.
        latency_modes: The loaded model's latency modes, ms (from its ``att_context_size`` list).
        languages: The model's language prompts (locales, in index order, plus ``"auto"`` if it has it); empty
            for a model without them (the English model, which transcribes English only).
        cache_bytes_per_stream: Encoder cache memory per stream slot, bytes (the fast step's projected K/V
            cache is twice NeMo's layer-input cache: 14.55 MB fp32 / 7.28 MB bf16 for the 600M model, against
            7.67 / 3.84 MB with ``encoder_step="nemo"``).
        max_streams: Capacity.
        load_seconds: Time to load the model, seconds.
        encoder_step: The encoder step that runs (``"fast"`` or ``"nemo"``; ``"nemo"`` also when the fast
            step does not support the loaded encoder).
        gpu_path: On CUDA, what runs there: CUDA graphs captured so far (count, failed shapes, reserved
            bytes) and whether NeMo's CUDA-graph RNNT decoder is on; ``None`` on CPU.

    """

    model: str
    device: str
    dtype: str
    latency_modes: tuple[int, ...]
    cache_bytes_per_stream: int
    max_streams: int
    load_seconds: float
    encoder_step: str = "fast"
    languages: tuple[str, ...] = ()
    gpu_path: dict[str, Any] | None = None
