"""One synthesis request: its record (:class:`Synthesis`), its caller's handle (:class:`SynthesisStream`), its chunks.

The engine's worker thread fills a stream (:meth:`SynthesisStream.start`, :meth:`~SynthesisStream.emit`,
:meth:`~SynthesisStream.finish`); the caller consumes it from one place, with ``for`` from a thread or
``async for`` from an event loop. Plain Python and numpy: no torch here.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipecat_nemotron.tts.magpie.errors import MagpieSynthesisError
from pipecat_nemotron.tts.magpie.options import MagpieSynthesisOptions

_ids = itertools.count(1)

#: How a request can end.
ENDINGS = ("completed", "truncated", "cancelled", "failed")


@dataclass(frozen=True)
class AudioChunk:
    """A piece of synthesised speech.

    Attributes:
        audio: Mono int16 PCM samples.
        sample_rate: Sample rate of ``audio``, in Hz (the codec's output rate).
        first_frame: Index of the first codec frame in this chunk, counted from the start of the request.
        num_frames: Codec frames in this chunk.

    """

    audio: np.ndarray
    sample_rate: int
    first_frame: int
    num_frames: int

    @property
    def duration_s(self) -> float:
        """Duration of the chunk, in seconds."""
        return len(self.audio) / self.sample_rate


@dataclass(eq=False)
class Synthesis:
    """One request as the engine tracks it: what was asked, how far it got, and when.

    The scheduler's policy (:mod:`~pipecat_nemotron.tts.magpie.policy`) advances the progress counters; the
    stream handle stamps the times. Only the engine's worker thread writes it (``cancelled`` aside); a caller reads
    it as ``stream.stats``.

    Attributes:
        text: Text to speak.
        speaker_index: Baked speaker of the voice.
        language: ISO 639-1 code.
        options: Per-request options.
        internal: The engine's own warm-up request (no truncation warning).
        id: Unique id (the key of the request's row in the model runner).
        submitted_at: ``time.perf_counter()`` when the request was submitted.
        started_at: When the worker started it (None while queued or if skipped).
        first_audio_at: When its first audio chunk was ready.
        finished_at: When it ended, whatever the outcome.
        frames: Codec frames kept (decoded, or to decode, to audio).
        chunks: Audio chunks emitted.
        audio_frames: Codec frames whose audio was emitted.
        max_frames: Codec frames ``options.max_duration_s`` allows (set when the request starts).
        text_chunks: Token chunks of its text (None until it starts).
        text_chunk: Index of the text chunk being decoded (or prefilled next).
        row_steps: Decoder steps of the current text chunk's row (the end-of-speech step included).
        cancelled: :meth:`SynthesisStream.cancel` was called.
        ending: How it ends once its last audio is out (one of :data:`ENDINGS`); None while it runs.
        error: Why it failed.

    """

    text: str
    speaker_index: int
    language: str
    options: MagpieSynthesisOptions
    internal: bool = False
    id: int = field(default_factory=lambda: next(_ids))
    submitted_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None
    first_audio_at: float | None = None
    finished_at: float | None = None
    frames: int = 0
    chunks: int = 0
    audio_frames: int = 0
    max_frames: int = 0
    text_chunks: int | None = None
    text_chunk: int = 0
    row_steps: int = 0
    cancelled: bool = False
    ending: str | None = None
    error: BaseException | None = None

    @property
    def queue_wait_s(self) -> float | None:
        """Seconds spent queued behind other requests."""
        return None if self.started_at is None else self.started_at - self.submitted_at

    @property
    def time_to_first_audio_s(self) -> float | None:
        """Seconds from submission to the first audio chunk (includes queueing)."""
        return None if self.first_audio_at is None else self.first_audio_at - self.submitted_at


_END = object()


class SynthesisStream:
    """Handle on one synthesis request: iterate it for audio chunks, cancel it to stop.

    ``status`` moves from ``"queued"`` to ``"running"`` to one of ``"completed"`` (the model ended the speech),
    ``"truncated"`` (``max_duration_s`` reached), ``"cancelled"`` or ``"failed"``. Iteration ends after the last
    chunk; for a failed request it raises :class:`MagpieSynthesisError`. Consume a stream from one place only.

    Args:
        synthesis: The request.

    """

    def __init__(self, synthesis: Synthesis) -> None:
        self.synthesis = synthesis
        self._status = "queued"
        self._items: collections.deque[Any] = collections.deque()
        self._cond = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None

    def __repr__(self) -> str:
        return f"SynthesisStream#{self.id}({self._status})"

    @property
    def id(self) -> int:
        """The request's id."""
        return self.synthesis.id

    @property
    def stats(self) -> Synthesis:
        """The request's record: its timings (``queue_wait_s``, ``time_to_first_audio_s``, ...) and counts."""
        return self.synthesis

    @property
    def status(self) -> str:
        """``"queued"``, ``"running"``, ``"completed"``, ``"truncated"``, ``"cancelled"`` or ``"failed"``."""
        return self._status

    @property
    def done(self) -> bool:
        """Whether the request has ended (its last chunk may still be unread)."""
        return self._status in ENDINGS

    @property
    def error(self) -> BaseException | None:
        """Why the request failed (None unless ``status == "failed"``)."""
        return self.synthesis.error if self.done else None

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called."""
        return self.synthesis.cancelled

    def cancel(self) -> None:
        """Stop the request: skipped if still queued, stopped at its next codec frame if running. Idempotent."""
        self.synthesis.cancelled = True

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the request has ended; return whether it has. Does not consume chunks."""
        with self._cond:
            return self._cond.wait_for(lambda: self.done, timeout)

    # Worker side (the engine's worker thread only).

    def start(self) -> None:
        """Mark the request running (the worker took it off the queue)."""
        self.synthesis.started_at = time.perf_counter()
        self._status = "running"

    def emit(self, chunk: AudioChunk) -> None:
        """Hand one audio chunk to the caller."""
        if self.synthesis.first_audio_at is None:
            self.synthesis.first_audio_at = time.perf_counter()
        self._put(chunk)

    def finish(self, status: str, error: BaseException | None = None) -> None:
        """End the request with ``status`` (one of :data:`ENDINGS`); iteration ends after the chunks queued so far.

        Raises:
            ValueError: ``status`` is not an ending.

        """
        if status not in ENDINGS:
            raise ValueError(f"a request ends {', '.join(ENDINGS)}, not {status!r}")
        self.synthesis.finished_at = time.perf_counter()
        with self._cond:
            self._status = status
            self.synthesis.error = error
        self._put(_END)

    def _put(self, item: Any) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify_all()
            loop, wakeup = self._loop, self._wakeup
        if loop is not None and wakeup is not None:
            with contextlib.suppress(RuntimeError):  # The consumer's loop has closed: nobody is listening.
                loop.call_soon_threadsafe(wakeup.set)

    # Consumer side.

    def _pop(self) -> Any:
        item = self._items.popleft()
        if item is _END:
            self._items.appendleft(_END)  # Stay ended for repeated iteration.
            error = self.synthesis.error
            if error is not None:
                raise MagpieSynthesisError(f"Magpie synthesis failed: {error}") from error
            raise StopIteration
        return item

    def __iter__(self) -> Iterator[AudioChunk]:
        return self

    def __next__(self) -> AudioChunk:
        with self._cond:
            self._cond.wait_for(lambda: bool(self._items))
            return self._pop()

    def __aiter__(self) -> AsyncIterator[AudioChunk]:
        return self

    async def __anext__(self) -> AudioChunk:
        while True:
            with self._cond:
                if self._items:
                    try:
                        return self._pop()
                    except StopIteration:
                        raise StopAsyncIteration from None
                if self._wakeup is None:
                    self._loop = asyncio.get_running_loop()
                    self._wakeup = asyncio.Event()
                self._wakeup.clear()
                wakeup = self._wakeup
            await wakeup.wait()
