"""One synthesis request as its caller sees it: the :class:`SynthesisStream` handle, its chunks and its stats.

The engine's worker thread fills a stream (``_put``, ``_finish``); the caller consumes it from one place, with
``for`` from a thread or ``async for`` from an event loop.
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


_END = object()


@dataclass
class _Request:
    text: str
    speaker_index: int
    language: str
    options: MagpieSynthesisOptions
    internal: bool = False  # The warm-up request: no truncation warning.


@dataclass
class SynthesisStats:
    """Timings and counts of one request, filled in by the worker thread.

    Attributes:
        submitted_at: ``time.perf_counter()`` when the request was submitted.
        started_at: When the worker started it (None while queued or if skipped).
        first_audio_at: When its first audio chunk was ready.
        finished_at: When it ended, whatever the outcome.
        frames: Codec frames kept (decoded to audio).
        chunks: Audio chunks emitted.

    """

    submitted_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None
    first_audio_at: float | None = None
    finished_at: float | None = None
    frames: int = 0
    chunks: int = 0

    @property
    def queue_wait_s(self) -> float | None:
        """Seconds spent queued behind other requests."""
        return None if self.started_at is None else self.started_at - self.submitted_at

    @property
    def time_to_first_audio_s(self) -> float | None:
        """Seconds from submission to the first audio chunk (includes queueing)."""
        return None if self.first_audio_at is None else self.first_audio_at - self.submitted_at


class SynthesisStream:
    """Handle on one synthesis request: iterate it for audio chunks, cancel it to stop.

    ``status`` moves from ``"queued"`` to ``"running"`` to one of ``"completed"`` (the model ended the speech),
    ``"truncated"`` (``max_duration_s`` reached), ``"cancelled"`` or ``"failed"``. Iteration ends after the last
    chunk; for a failed request it raises :class:`MagpieSynthesisError`. Consume a stream from one place only.
    """

    _ids = itertools.count(1)

    def __init__(self, request: _Request) -> None:
        self.id = next(self._ids)
        self.stats = SynthesisStats()
        self._request = request
        self._cancel = threading.Event()
        self._status = "queued"
        self._error: BaseException | None = None
        self._items: collections.deque[Any] = collections.deque()
        self._cond = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None

    def __repr__(self) -> str:
        return f"SynthesisStream#{self.id}({self._status})"

    @property
    def status(self) -> str:
        """``"queued"``, ``"running"``, ``"completed"``, ``"truncated"``, ``"cancelled"`` or ``"failed"``."""
        return self._status

    @property
    def done(self) -> bool:
        """Whether the request has ended (its last chunk may still be unread)."""
        return self._status in ("completed", "truncated", "cancelled", "failed")

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called."""
        return self._cancel.is_set()

    def cancel(self) -> None:
        """Stop the request: skipped if still queued, stopped at its next codec frame if running. Idempotent."""
        self._cancel.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the request has ended; return whether it has. Does not consume chunks."""
        with self._cond:
            return self._cond.wait_for(lambda: self.done, timeout)

    # Worker side.

    def _put(self, item: Any) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify_all()
            loop, wakeup = self._loop, self._wakeup
        if loop is not None and wakeup is not None:
            with contextlib.suppress(RuntimeError):  # The consumer's loop has closed: nobody is listening.
                loop.call_soon_threadsafe(wakeup.set)

    def _finish(self, status: str, error: BaseException | None = None) -> None:
        self.stats.finished_at = time.perf_counter()
        with self._cond:
            self._status = status
            self._error = error
        self._put(_END)

    # Consumer side.

    def _pop(self) -> Any:
        item = self._items.popleft()
        if item is _END:
            self._items.appendleft(_END)  # Stay ended for repeated iteration.
            if self._error is not None:
                raise MagpieSynthesisError(f"Magpie synthesis failed: {self._error}") from self._error
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
