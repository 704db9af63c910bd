"""What the Nemotron STT services put in ``TranscriptionFrame.result``: the words with timings and confidence.

Both services (in-process :class:`~pipecat_nemotron.stt.NemotronSTTService` and the server client
:class:`~pipecat_nemotron.stt.remote.service.NemotronServerSTTService`) set ``result`` of every final
``TranscriptionFrame`` to a :class:`TranscriptResult`; the in-process service also sets it on interim frames.
Plain Python: no Pipecat, no NeMo (the wire form of words is the protocol's: :mod:`pipecat_nemotron.server.protocol`).
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from pipecat_nemotron.asr.types import TranscriptUpdate, WordTiming
from pipecat_nemotron.server.protocol_server import words_from_wire, words_to_wire

if TYPE_CHECKING:
    from pipecat_nemotron.server.protocol import FinalMessage


@dataclass(frozen=True)
class TranscriptResult:
    """A transcript with its words' timings and confidence.

    Attributes:
        text: The transcript (the frame's ``text``).
        words: Each word with its start and end (ms from the stream's start and from the utterance's start)
            and its confidence in [0, 1]; see :class:`~pipecat_nemotron.asr.types.WordTiming`. Empty when the
            engine runs with ``word_timings=False`` or the server did not send them.
        confidence: Confidence of the whole transcript, in [0, 1] (mean of its words'); None without words.
        utterance: 0-based index of the utterance within the stream (the server session).
        latency_ms: Latency mode that produced it.
        is_final: True for a final transcript.
        start_ms: Where the utterance starts, ms from the stream's start (as ``TranscriptUpdate.start_ms``;
            a word's ``utterance_start_ms`` counts from here). For the server STT
            service the stream is the server session: after a reconnect, times count from the new session.
        language: The language prompt the model decoded with (``"es-ES"``, ``"auto"``) on a multilingual
            model; None on the English one.
        detected_language: On finals decoded with ``"auto"``: the locale the model found the words to be in.
            The frame's own ``language`` is Pipecat's ``Language`` of this, else of ``language``.

    Example (in a processor after the STT service)::

        if isinstance(frame, TranscriptionFrame) and isinstance(frame.result, TranscriptResult):
            for word in frame.result.words:
                print(f"{word.start_ms:8.0f} {word.end_ms:8.0f} {word.confidence:.2f} {word.text}")

    """

    text: str
    words: tuple[WordTiming, ...] = ()
    confidence: float | None = None
    utterance: int = 0
    latency_ms: int = 0
    is_final: bool = True
    start_ms: float = 0.0
    language: str | None = None
    detected_language: str | None = None

    @classmethod
    def from_update(cls, update: TranscriptUpdate) -> TranscriptResult:
        """The result of an engine update (partial or final)."""
        return cls(
            text=update.text,
            words=update.words,
            confidence=update.confidence,
            utterance=update.utterance,
            latency_ms=update.latency_ms,
            is_final=update.is_final,
            start_ms=update.start_ms,
            language=update.language,
            detected_language=update.detected_language,
        )

    @classmethod
    def from_message(cls, msg: FinalMessage) -> TranscriptResult:
        """The result of a server ``final`` message (words only if the session asked for them)."""
        start = max(0.0, msg.audio_ms - msg.utterance_audio_ms)
        words = words_from_wire(msg)
        return cls(
            msg.text,
            words,
            msg.confidence,
            msg.utterance,
            msg.latency_ms,
            True,
            start,
            msg.language,
            msg.detected_language,
        )

    @property
    def utterance_start_ms(self) -> float:
        """Deprecated name of :attr:`start_ms` (it meant the utterance's start; a word's means the word's)."""
        warnings.warn("TranscriptResult.utterance_start_ms is now start_ms", DeprecationWarning, stacklevel=2)
        return self.start_ms

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (times rounded to 0.1 ms, confidences to 4 digits)."""
        data = asdict(self)
        data["words"] = words_to_wire(self.words)
        if self.confidence is not None:
            data["confidence"] = round(self.confidence, 4)
        return data

    def format_words(self) -> str:
        """One line per word: start and end (s from the stream's start), confidence, text."""
        return "\n".join(
            f"{w.start_ms / 1000:8.2f} s {w.end_ms / 1000:8.2f} s  {w.confidence:4.2f}  {w.text}"
            for w in self.words
        )

