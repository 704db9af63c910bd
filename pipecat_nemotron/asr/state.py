"""Per-stream state. It lives on the stream, never on the shared engine or model objects.

The event loop appends audio and queues control requests; the scheduler's worker thread reads and advances
the decoding fields only while a step runs, and the scheduler touches them between steps. The two never
overlap because the scheduler awaits each step before doing anything else.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pipecat_nemotron.asr.audio import AudioInput
from pipecat_nemotron.asr.features import FeatureCursor
from pipecat_nemotron.asr.types import WordTiming
from pipecat_nemotron.asr.words import TokenTrace

if TYPE_CHECKING:  # torch-backed; the runner fills it on the worker thread
    from pipecat_nemotron.asr.boosting import BoostList
    from pipecat_nemotron.asr.language_id import UtteranceEvidence


@dataclass
class PendingFinal:
    """A finalize request: the utterance ends at ``boundary`` (absolute stream sample, 16 kHz).

    Attributes:
        boundary: Absolute stream sample (16 kHz) where the utterance ends.
        requested_at: Monotonic time of the request.
        future: Resolved with the final for a caller that awaits it (:meth:`ASRStream.finalize`); None for
            one that reads finals from the stream's updates only (:meth:`ASRStream.request_final`).

    """

    boundary: int
    requested_at: float
    future: asyncio.Future[Any] | None = None


@dataclass
class PendingPeek:
    """A peek request: the text utterance ``utterance`` would end with if it ended at ``boundary``.

    Attributes:
        boundary: Absolute stream sample (16 kHz) the peek covers the audio up to.
        requested_at: Monotonic time of the request.
        future: Resolved with a :class:`~pipecat_nemotron.asr.types.Transcript`.
        utterance: Index of the utterance peeked at (finalizes requested before the peek come first).

    """

    boundary: int
    requested_at: float
    future: asyncio.Future[Any]
    utterance: int


@dataclass
class StreamState:
    """Everything the engine knows about one stream.

    Attributes:
        stream_id: Engine-unique id (also the key of the stream's cache slot).
        latency_ms: Current latency mode.
        pending_latency_ms: Mode requested and not applied yet (see :mod:`~pipecat_nemotron.asr.changes`).
        language: Language prompt key of a multilingual model (``"es-ES"``, ``"auto"``); None otherwise.
        prompt_index: One-hot index of ``language`` (None without prompts).
        pending_language: ``(language, prompt_index)`` requested and not applied yet.
        boost: Phrase-boosting list decoded with now (None: not boosted).
        pending_boost: List requested and not applied yet (an empty list: stop boosting).
        eou: Deliver the model's end-of-utterance events (``"eou"`` records) to the stream's updates.
        pending_utterance: The utterance the pending changes are for (finalizes requested before them come
            first).
        evidence: An ``auto`` stream's current utterance as kept for language detection.
        detected_language: The language detected at the current utterance's final (``auto`` streams).
        received: Samples received since the stream opened (16 kHz).
        utterance_origin: Absolute sample where the current utterance starts (the previous final's boundary,
            or a forced split's cut): its reported positions and word times count from here.
        segment_origin: Absolute sample where the current feature segment starts (``utterance_origin``, or
            later when a change restarted a hard-mode decode mid-utterance).
        cursor: Audio and frame position inside the current segment.
        arrivals: ``(absolute sample count, monotonic time)`` of recent pushes, to time chunk lag.
        finals: Pending finalize requests, oldest first.
        peeks: Pending peek requests, oldest first.
        encoder_started: The stream's cache slot holds context (later chunks carry a pre-encode cache).
        dec_state: RNNT prediction-network state after the last step (None: start of sequence).
        decoded_frames: Encoder frames decoded since ``dec_state`` was None (NeMo's greedy decoder counts
            token frames from there).
        tokens: Token ids of the current utterance.
        text: Detokenised ``tokens``.
        trace: Encoder frame and confidence of each of ``tokens``.
        words: ``tokens`` as timed words (updated with ``text``).
        utterance_frames: Mel frames consumed in the current utterance.
        utterance_index: 0-based index of the current utterance.
        in_flight: A chunk of this stream is in the step that is running now.
        step_waiters: Futures resolved when the stream's chunk in flight has been delivered (or it ends).
        audio_seconds: Audio processed by the model, seconds (usage metering).

    """

    stream_id: int
    latency_ms: int
    pending_latency_ms: int | None = None
    language: str | None = None
    prompt_index: int | None = None
    pending_language: tuple[str | None, int | None] | None = None
    boost: BoostList | None = None
    pending_boost: BoostList | None = None
    eou: bool = False
    pending_utterance: int = 0
    evidence: UtteranceEvidence | None = None
    detected_language: str | None = None
    input: AudioInput = field(default_factory=AudioInput)
    received: int = 0
    utterance_origin: int = 0
    segment_origin: int = 0
    cursor: FeatureCursor = field(default_factory=FeatureCursor)
    arrivals: deque[tuple[int, float]] = field(default_factory=deque)
    finals: deque[PendingFinal] = field(default_factory=deque)
    peeks: deque[PendingPeek] = field(default_factory=deque)
    encoder_started: bool = False
    dec_state: Any = None
    decoded_frames: int = 0
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    trace: TokenTrace = field(default_factory=TokenTrace)
    words: tuple[WordTiming, ...] = ()
    utterance_frames: int = 0
    utterance_started_at: float | None = None
    audio_seconds: float = 0.0
    utterance_index: int = 0
    in_flight: bool = False
    step_waiters: list[asyncio.Future[None]] = field(default_factory=list)
    closed: bool = False
    error: BaseException | None = None

    def append_audio(self, samples: np.ndarray) -> None:
        """Add converted 16 kHz samples and remember when they arrived."""
        if samples.size == 0:
            return
        self.cursor.append(samples)
        self.received += samples.size
        self.arrivals.append((self.received, time.monotonic()))
        if self.utterance_started_at is None:
            self.utterance_started_at = time.monotonic()

    def arrival_time(self, absolute_sample: int) -> float:
        """Monotonic time at which sample ``absolute_sample`` had arrived (drops older records)."""
        while len(self.arrivals) > 1 and self.arrivals[1][0] <= absolute_sample:
            self.arrivals.popleft()
        for count, t in self.arrivals:
            if count >= absolute_sample:
                return t
        return self.arrivals[-1][1] if self.arrivals else time.monotonic()

    def segment_limit(self) -> tuple[int, bool]:
        """Relative sample up to which the current segment may be read, and whether that is an utterance end."""
        if self.finals:
            return self.finals[0].boundary - self.segment_origin, True
        return self.cursor.end, False
