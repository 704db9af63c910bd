"""What the engine hands to callers: the one transcript record, its words, and facts about a started engine."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal


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

    def to_dict(self) -> dict[str, Any]:
        """The word as a ``final`` message sends it: text, start and end (ms from the stream's start), confidence."""
        return {
            "text": self.text,
            "start_ms": round(self.start_ms, 1),
            "end_ms": round(self.end_ms, 1),
            "confidence": round(self.confidence, 4),
        }


TranscriptKind = Literal["partial", "final", "peek", "eou"]
"""What a :class:`Transcript` is: the text so far, an utterance's final text, a peek's answer, or the model's
end-of-utterance event."""


@dataclass(frozen=True)
class Transcript:
    """One transcript record, the same from the engine to the Pipecat frame: a partial, a final, a peek, an eou.

    The engine's stream yields it (:meth:`~pipecat_nemotron.asr.stream.ASRStream.updates`, ``finalize()``,
    ``peek()``), the STT services put it in ``TranscriptionFrame.result`` (the server client builds it from the
    ``final`` message, :func:`~pipecat_nemotron.server.protocol_server.transcript_from_final`). Fields a kind does
    not have keep their defaults (a partial has no ``ttf_ms``).

    An ``"eou"`` record comes only on a stream opened with ``eou=True`` on a model that emits ``<EOU>``
    (:mod:`~pipecat_nemotron.asr.eou`): the model says the utterance ended at ``eou_ms``. It carries the text
    so far, as a partial does, and ends nothing: the utterance goes on until ``finalize()`` (a turn strategy
    decides). At most one per model step of a stream, in order with the partials and before the final of the
    step that emitted it. Peeks never report one.

    Attributes:
        text: The utterance's text so far (partial, eou), in full (final), or as it would end now (peek). Never
            holds a model's ``<EOU>`` or ``<EOB>`` marker.
        kind: ``"partial"``, ``"final"``, ``"peek"`` or ``"eou"``.
        utterance: 0-based index of the utterance within the stream (a server client's: the session).
        latency_ms: Latency mode that produced it.
        language: Language prompt the model decoded with (a locale such as ``"es-ES"``, or ``"auto"``); None
            on a model without language prompts (the English model).
        detected_language: On the final of an utterance decoded with ``"auto"``: the model's locale whose prompt
            explains the words best (see :mod:`~pipecat_nemotron.asr.language_id`); None otherwise.
        words: The words of ``text`` with their timings and confidence (on partials, the last word may still
            grow); empty when the engine runs with ``word_timings=False`` or the server did not send them.
        confidence: Confidence of the whole text, in [0, 1] (mean of the words'); None without words.
        start_ms: Where the utterance starts, ms from the stream's first sample (a word's ``utterance_start_ms``
            counts from here). For the server client the stream is the server session.
        utterance_audio_ms: On finals and peeks: audio of the utterance they cover, ms (``start_ms +
            utterance_audio_ms`` is where the next utterance starts, after a final).
        tokens: On finals and peeks: token ids of the utterance.
        forced: On finals: the utterance reached ``EngineConfig.max_utterance_s`` and was split without a
            ``finalize()`` (see :mod:`~pipecat_nemotron.asr.splits`): the speech goes on in the next
            utterance, no finalize request is answered by it, and ``ttf_ms`` is None.
        queue_ms: On partials: time the chunk's audio waited for a model step, ms.
        step_ms: Duration of the batched model step that produced it, ms.
        lag_ms: On partials: time from the chunk's last audio sample arriving to this record, ms.
        ttf_ms: On finals: time from the ``finalize()`` call to the final text, ms.
        peek_ms: On peeks: time from the ``peek()`` call to the text, ms.
        eou_ms: On eou events: where the model emitted ``<EOU>``, ms from the stream's first sample (the end of
            the 80 ms encoder frame it was emitted at; ``eou_ms - start_ms`` is the utterance's audio up to it).

    Example (in a processor after an STT service)::

        if isinstance(frame, TranscriptionFrame) and isinstance(frame.result, Transcript):
            for word in frame.result.words:
                print(f"{word.start_ms:8.0f} {word.end_ms:8.0f} {word.confidence:.2f} {word.text}")

    """

    text: str
    kind: TranscriptKind
    utterance: int = 0
    latency_ms: int = 0
    language: str | None = None
    detected_language: str | None = None
    words: tuple[WordTiming, ...] = ()
    confidence: float | None = None
    start_ms: float = 0.0
    utterance_audio_ms: float | None = None
    tokens: tuple[int, ...] = ()
    forced: bool = False
    queue_ms: float = 0.0
    step_ms: float = 0.0
    lag_ms: float = 0.0
    ttf_ms: float | None = None
    peek_ms: float | None = None
    eou_ms: float | None = None

    @property
    def is_final(self) -> bool:
        """True for the final text of an utterance (a forced split's too)."""
        return self.kind == "final"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (times rounded to 0.1 ms, confidences to 4 digits; words as the wire sends them)."""
        data = asdict(self)
        data["words"] = [w.to_dict() for w in self.words]
        data["tokens"] = list(self.tokens)
        if self.confidence is not None:
            data["confidence"] = round(self.confidence, 4)
        return data

    def format_words(self) -> str:
        """One line per word: start and end (s from the stream's start), confidence, text."""
        return "\n".join(
            f"{w.start_ms / 1000:8.2f} s {w.end_ms / 1000:8.2f} s  {w.confidence:4.2f}  {w.text}"
            for w in self.words
        )


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
        eou: The model emits ``<EOU>``: streams may ask for end-of-utterance events (``open_stream(eou=True)``).

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
    eou: bool = False
