"""The cheap per-stream handle users hold: push audio, read updates, finalize, change latency, close."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

import numpy as np
from loguru import logger

from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE, SAMPLES_PER_MS
from pipecat_nemotron.asr.errors import InvalidAudioError, StreamClosedError, StreamFailedError
from pipecat_nemotron.asr.state import PendingFinal, PendingPeek, StreamState
from pipecat_nemotron.asr.types import Transcript


class StreamOwner(Protocol):
    """What a stream needs from the engine that opened it (:class:`NemotronEngine` implements it).

    The stream holds its own state and queues its requests on it (audio, finalizes, peeks); the owner only
    wakes its scheduler, checks and applies setting changes, and closes the stream. Nothing else of the engine
    is reachable from a stream.
    """

    @property
    def hop_samples(self) -> int:
        """Samples (16 kHz) per mel frame."""
        ...

    def chunk_ms(self, latency_ms: int) -> float:
        """Audio per regular model step in a latency mode, ms."""
        ...

    def wake(self) -> None:
        """Tell the scheduler that a stream queued work (audio, a finalize, a peek)."""
        ...

    def request_latency(self, state: StreamState, latency_ms: int) -> None:
        """Validate a mode change against the loaded model and queue it.

        Raises:
            ValueError: Not one of the model's modes (names them).

        """
        ...

    def request_language(self, state: StreamState, language: Any) -> None:
        """Resolve a language change against the loaded model and queue it.

        Raises:
            ValueError: The model has no such language (names the model's).

        """
        ...

    def request_boost(self, state: StreamState, phrases: Sequence[str] | None, alpha: float | None) -> None:
        """Validate a boost-list change against the engine's limits and the model's characters, and queue it.

        Raises:
            BoostPhraseError: Naming the limit or the phrase.
            BoostingUnavailableError: The engine has no per-stream biasing.

        """
        ...

    async def close_stream(self, state: StreamState, error: BaseException | None = None) -> None:
        """Close the stream (failed with ``error`` if given); returns once its cache slot is free."""
        ...


class UpdateQueue:
    """Transcript updates of one stream, in order. Unread partials coalesce; finals and eou events never drop."""

    def __init__(self) -> None:
        self._items: deque[Transcript] = deque()
        self._event = asyncio.Event()
        self._closed = False
        self._error: BaseException | None = None

    def put(self, update: Transcript) -> None:
        """Queue an update (a partial replaces an unread partial of the same utterance)."""
        if self._items and self._items[-1].kind == "partial" and update.kind == "partial":
            if self._items[-1].utterance == update.utterance:
                self._items[-1] = update
                return
        self._items.append(update)
        self._event.set()

    def take_forced_finals(self) -> list[Transcript]:
        """Empty the queue; return the forced finals it held, in order."""
        items, self._items = list(self._items), deque()
        return [u for u in items if u.is_final and u.forced]

    def close(self, error: BaseException | None = None) -> None:
        """End the iteration after the queued updates (raising ``error`` if given)."""
        self._closed = True
        self._error = error
        self._event.set()

    async def get(self) -> Transcript | None:
        """Next update, or None once closed and drained.

        Raises:
            StreamFailedError: The stream failed; raised after the updates queued before the failure.

        """
        while not self._items:
            if self._closed:
                if self._error is not None:
                    raise self._error
                return None
            self._event.clear()
            await self._event.wait()
        return self._items.popleft()


class ASRStream:
    """One audio stream (one user's session) on a shared :class:`NemotronEngine`.

    Create with :meth:`NemotronEngine.open_stream`. All methods must be called from the engine's event loop.

    Args:
        owner: The engine that opened the stream.
        state: The stream's state (registered with the owner's scheduler).

    """

    def __init__(self, owner: StreamOwner, state: StreamState) -> None:
        self._owner = owner
        self._state = state
        self.updates_queue = UpdateQueue()
        self._utterance = 0

    @property
    def stream_id(self) -> int:
        """Engine-unique id of this stream."""
        return self._state.stream_id

    @property
    def eou(self) -> bool:
        """The stream's updates carry the model's end-of-utterance events (``"eou"`` records)."""
        return self._state.eou

    @property
    def latency_ms(self) -> int:
        """Latency mode in force (a requested change shows here once it applies, see :meth:`set_latency`)."""
        return self._state.latency_ms

    @property
    def chunk_ms(self) -> float:
        """Audio per regular model step in the current mode, ms."""
        return self._owner.chunk_ms(self._state.latency_ms)

    @property
    def backlog_ms(self) -> float:
        """Audio received but not yet taken into a model step, ms (grows when the engine falls behind)."""
        st = self._state
        consumed = st.segment_origin + st.cursor.next_frame * self._owner.hop_samples
        return max(0, st.received - consumed) / SAMPLES_PER_MS

    @property
    def has_pending_speech(self) -> bool:
        """Audio or decoded tokens of the current utterance await a final."""
        return self.backlog_ms > 0 or bool(self._state.tokens)

    @property
    def tokens(self) -> tuple[int, ...]:
        """Token ids decoded so far in the current utterance (the final's ``tokens`` once it ends)."""
        return tuple(self._state.tokens)

    @property
    def in_flight(self) -> bool:
        """A chunk of this stream is in the model step running now."""
        return self._state.in_flight

    @property
    def closed(self) -> bool:
        """True after ``close()`` or a failure."""
        return self._state.closed

    @property
    def audio_seconds(self) -> float:
        """Audio this stream has had transcribed so far, seconds."""
        return self._state.audio_seconds

    def _check_open(self) -> None:
        if self._state.error is not None:
            raise StreamFailedError(
                f"stream {self.stream_id} failed: {self._state.error}"
            ) from self._state.error
        if self._state.closed:
            raise StreamClosedError(
                f"stream {self.stream_id} is closed; open a new one with engine.open_stream()"
            )

    async def push(
        self,
        audio: bytes | bytearray | memoryview | np.ndarray,
        sample_rate: int = MODEL_SAMPLE_RATE,
        num_channels: int = 1,
    ) -> None:
        """Queue audio for transcription. Returns at once; the scheduler processes it in the next steps.

        Args:
            audio: int16 little-endian PCM bytes, or a numpy int16/float array (see
                :class:`~pipecat_nemotron.asr.audio.AudioInput`). Empty input is a no-op.
            sample_rate: Rate of ``audio``, Hz (resampled to 16 kHz if different).
            num_channels: Interleaved channels (downmixed to mono).

        Raises:
            StreamClosedError: The stream was closed.
            InvalidAudioError: The audio is unusable; the stream is failed and its slot freed.

        """
        self._check_open()
        try:
            samples = self._state.input.convert(audio, sample_rate, num_channels)
        except InvalidAudioError as e:
            logger.error(f"ASR stream {self.stream_id} failed: {e}")
            await self._owner.close_stream(self._state, StreamFailedError(str(e)))
            raise
        if samples.size:
            self._state.append_audio(samples)
            self._owner.wake()

    async def finalize(self) -> Transcript:
        """End the current utterance: flush all audio pushed so far and return its final text.

        Audio pushed after this call belongs to the next utterance. Time-to-final (``ttf_ms``) is measured from
        this call to the final text being available. If the utterance was longer than the engine's
        ``max_utterance_s``, its earlier parts came through :meth:`updates` as forced finals and this is the
        last part (:meth:`NemotronEngine.transcribe` joins them).

        Raises:
            StreamClosedError / StreamFailedError: The stream was closed or failed before the final.

        """
        return await self.finalize_nowait()

    def finalize_nowait(self) -> asyncio.Future[Transcript]:
        """Like :meth:`finalize`, but mark the utterance boundary now and return a future of the final.

        For a caller that must not wait and reads no :meth:`updates` (a reader of :meth:`updates` gets the same
        final there: use :meth:`request_final`). Audio pushed right after this call goes to the next utterance.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Transcript] = loop.create_future()
        self._mark_boundary(future)
        return future

    def request_final(self) -> None:
        """End the current utterance now; its final arrives through :meth:`updates` (and nowhere else).

        What a reader of :meth:`updates` calls (the STT services, the model server's sessions): the final is
        delivered once, in order with the partials, and a stream that fails before it ends :meth:`updates` with
        the error. Audio pushed right after this call goes to the next utterance.

        Raises:
            StreamClosedError / StreamFailedError: The stream was closed or failed.

        """
        self._mark_boundary(None)

    def _mark_boundary(self, future: asyncio.Future[Transcript] | None) -> None:
        """Queue a finalize at the audio received so far (the input resampler's tail included)."""
        self._check_open()
        tail = self._state.input.flush()
        if tail.size:
            self._state.append_audio(tail)
        self._state.finals.append(PendingFinal(self._state.received, time.monotonic(), future))
        self._owner.wake()

    async def peek(self) -> Transcript:
        """The text the current utterance would end with if it ended now, without ending it.

        The same flush as :meth:`finalize` (the audio received so far, right context included), computed on
        copies of the stream's encoder caches, pre-encode cache and decoder state: the stream is left exactly
        as it was, and the chunks pushed afterwards decode as if no peek had happened. It costs one model step
        of the remaining frames (at most one chunk), batched with other streams' work like any chunk; the
        chunks before it are decoded first, as for a final. Audio still inside the input resampler (a few
        samples, only when pushing at a rate other than 16 kHz) is not covered.

        Raises:
            StreamClosedError / StreamFailedError: The stream was closed or failed before the answer.

        """
        return await self.peek_nowait()

    def peek_nowait(self) -> asyncio.Future[Transcript]:
        """Like :meth:`peek`, but return a future of the answer (it covers the audio pushed before this call).

        A peek requested after a ``finalize()`` whose final has not arrived yet is about the next utterance.
        """
        self._check_open()
        state = self._state
        loop = asyncio.get_running_loop()
        pending = PendingPeek(
            state.received, time.monotonic(), loop.create_future(), state.utterance_index + len(state.finals)
        )
        state.peeks.append(pending)
        self._owner.wake()
        return pending.future

    def set_latency(self, latency_ms: int) -> None:
        """Switch the latency mode (one of the model's: 80, 160, 560 or 1120 ms for the English model).

        Applies to the first utterance of which no word has been emitted yet: before the next chunk if the
        current utterance has no word so far (silence decoded in the old mode does not count) and no
        ``finalize()`` is pending, else from the utterance after the last pending or next ``finalize()``. All
        words of an utterance are decoded in one mode (the rule in full: :mod:`~pipecat_nemotron.asr.changes`).
        :meth:`settled` tells when the choice is made. The weights are shared; nothing is reloaded.

        Raises:
            ValueError: Unsupported mode (names the allowed values).

        """
        self._check_open()
        self._owner.request_latency(self._state, latency_ms)

    @property
    def language(self) -> str | None:
        """The language prompt the stream decodes with now (``"es-ES"``, ``"auto"``; None: English-only model).

        A requested change shows here once it applies.
        """
        return self._state.language

    def set_language(self, language: Any) -> None:
        """Switch the language of a multilingual model.

        ``language``: a locale, a bare language, Pipecat's ``Language`` or ``"auto"``; None: the engine's
        default.

        Applies like :meth:`set_latency`: from the first utterance of which no word has been emitted yet (all
        words of an utterance are decoded in one language).

        Raises:
            ValueError: The model has no such language (names the model's).

        """
        self._check_open()
        self._owner.request_language(self._state, language)

    @property
    def boost_phrases(self) -> tuple[str, ...]:
        """The phrases the stream is boosted with now (normalised; empty: none). A change shows once it applies."""
        boost = self._state.boost
        return boost.phrases if boost is not None else ()

    @property
    def boost_alpha(self) -> float | None:
        """The weight of the boost in force (None: not boosted)."""
        boost = self._state.boost
        return boost.alpha if boost is not None else None

    def set_boost_phrases(self, phrases: Sequence[str] | None, alpha: float | None = None) -> None:
        """Replace the phrases this stream's decoder favours (names, product words).

        Applies like :meth:`set_latency`: from the first utterance of which no word has been emitted yet (every
        word of an utterance is decoded with one list). Spell and case the phrases as the model writes them
        (:mod:`~pipecat_nemotron.asr.boosting`). Each distinct ``(phrases, alpha)`` is built once, on a
        builder thread from this call on (~0.2 s for 1,000 phrases), and shared by the streams that use it.

        Args:
            phrases: The new list; None or empty: no boosting (the config's ``default_boost_phrases`` apply
                only to :meth:`NemotronEngine.open_stream`).
            alpha: Weight of the boost, in (0, 10]; None: the config's ``default_boost_alpha``.

        Raises:
            BoostPhraseError: Too many phrases, one too long or empty, or a character the model cannot write (a
                ``ValueError``; the stream keeps its list and goes on).
            BoostingUnavailableError: Phrases were given but the engine has no per-stream biasing.

        """
        self._check_open()
        self._owner.request_boost(self._state, phrases, alpha)

    async def settled(self) -> None:
        """Return once no chunk of this stream is in a model step (at once if none is).

        A :meth:`set_latency` or :meth:`set_language` called before has then either applied (:attr:`latency_ms`
        and :attr:`language` show it) or waits for the next utterance: a chunk in the step running now may bring
        the utterance's first word, which decides. Returns as well when the stream closes or fails.
        """
        state = self._state
        if not state.in_flight or state.closed:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        state.step_waiters.append(waiter)
        await waiter

    def take_forced_finals(self) -> list[Transcript]:
        """Remove and return the forced finals (``max_utterance_s`` splits) queued and not read yet.

        For callers that read results from :meth:`finalize` rather than :meth:`updates` (as
        :meth:`NemotronEngine.transcribe` does); the other queued updates are dropped.
        """
        return self.updates_queue.take_forced_finals()

    async def close(self) -> None:
        """Close the stream and free its cache slot (idempotent). Pending finalizes fail."""
        await self._owner.close_stream(self._state)

    async def updates(self) -> AsyncIterator[Transcript]:
        """Iterate over transcript updates (partials as the text grows, then the final of each utterance).

        On a stream opened with ``eou=True``, ``"eou"`` records come in between where the model emitted its
        end-of-utterance token (:class:`~pipecat_nemotron.asr.types.Transcript`); they end nothing.

        Ends when the stream is closed; raises :class:`StreamFailedError` if it failed.
        """
        while True:
            update = await self.updates_queue.get()
            if update is None:
                return
            yield update

    def __aiter__(self) -> AsyncIterator[Transcript]:
        return self.updates()
