"""The Magpie TTS side of the model server: :class:`TTSHost` (engine, admission, limits, metrics, drain).

Framework-independent, as :class:`~pipecat_nemotron.server.service.ASRService` is for ASR: the Riva gRPC layer
(:mod:`~pipecat_nemotron.server.riva_tts`) turns its protocol's requests into :class:`SynthesisRequest` and
sends what the :class:`SynthesisCall` that :meth:`TTSHost.synthesize` opens yields; a refusal is a
:class:`~pipecat_nemotron.server.errors.RequestError` with a gRPC status name.

The engine is driven directly (:meth:`MagpieEngine.submit`, one :class:`SynthesisStream` per request). Its worker
never waits for a client: each call's chunks go into a buffer of its own. Past ``TTSHostConfig.max_buffered_s``
of audio the call stops moving chunks into it (they wait in the call's engine stream) until its client takes
some; a client that takes nothing for ``TTSHostConfig.stall_timeout_s`` meanwhile has stopped reading and is
cancelled (its engine row freed) and logged. A client that reads slowly (a busy event loop, a slow network) is
never mistaken for one that stopped.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from loguru import logger

from pipecat_nemotron.server.errors import RequestError, RequestStatus
from pipecat_nemotron.server.tts_config import MAX_OUTPUT_RATE, MIN_OUTPUT_RATE, TTSHostConfig
from pipecat_nemotron.server.tts_metrics import TTSMetrics
from pipecat_nemotron.tts.magpie import (
    LANGUAGES,
    VOICES,
    AudioChunk,
    MagpieEngine,
    MagpieEngineError,
    MagpieSynthesisError,
    MagpieSynthesisOptions,
    SynthesisStream,
    normalize_language,
    normalize_voice,
)

__all__ = ["Reply", "SynthesisCall", "SynthesisRequest", "TTSHost"]


@dataclass(frozen=True)
class SynthesisRequest:
    """One synthesis request, whatever protocol carried it.

    Attributes:
        text: Text to speak.
        voice: A Magpie voice name (``"aria"``); None: the host's default voice.
        language: A language code (``"en-US"``, ``"de"``); None: English.
        sample_rate_hz: Rate of the audio to send, Hz (0: the codec's own rate, 22,050 Hz for the released model).
        seed: Seed of the request's sampling (None: random). The same seed gives the same audio alone or in a
            batch.

    """

    text: str
    voice: str | None = None
    language: str | None = None
    sample_rate_hz: int = 0
    seed: int | None = None


class _Resampler:
    """int16 mono PCM from the codec's rate to the request's, streaming (soxr keeps the filter history)."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self._stream: Any = None
        if in_rate != out_rate:
            import soxr

            self._stream = soxr.ResampleStream(in_rate, out_rate, 1, dtype="int16")

    def push(self, audio: np.ndarray) -> bytes:
        if self._stream is None:
            return audio.astype(np.int16, copy=False).tobytes()
        return self._stream.resample_chunk(audio.astype(np.int16, copy=False)).tobytes()

    def flush(self) -> bytes:
        if self._stream is None:
            return b""
        return self._stream.resample_chunk(np.zeros(0, dtype=np.int16), last=True).tobytes()


class SynthesisCall:
    """One admitted synthesis request: its engine stream and the audio made for it and not yet sent (bounded).

    Read it with :meth:`audio`. :attr:`abandoned` is set when the call must end without its client reading on (the
    client stopped reading, or the server is shutting down): a writer blocked on a client that does not read
    waits on it too, and then raises :attr:`error`.
    """

    def __init__(
        self,
        stream: SynthesisStream,
        out_rate: int,
        codec_rate: int,
        max_buffered_s: float,
        stall_timeout_s: float = TTSHostConfig.stall_timeout_s,
    ) -> None:
        self.stream = stream
        self.out_rate = out_rate
        self.max_buffered_s = max_buffered_s
        self.stall_timeout_s = stall_timeout_s
        self._taken = asyncio.Event()
        self.abandoned = asyncio.Event()
        self.error: RequestError | None = None
        self.outcome: str | None = None
        self.sent_bytes = 0
        self._resampler = _Resampler(codec_rate, out_rate)
        self._items: collections.deque[AudioChunk | RequestError | None] = collections.deque()
        self._buffered_s = 0.0
        self._ready = asyncio.Event()

    def _put(self, item: AudioChunk | RequestError | None) -> None:
        if isinstance(item, AudioChunk):
            self._buffered_s += item.duration_s
        self._items.append(item)
        self._ready.set()

    def abandon(self, error: RequestError, outcome: str) -> None:
        """End the call with ``error`` (idempotent: the first reason stays) and stop its engine row."""
        self.stream.cancel()
        if self.error is None:
            self.error, self.outcome = error, outcome
        self._items.clear()
        self._buffered_s = 0.0
        self._put(error)
        self.abandoned.set()
        self._taken.set()  # a pump waiting for the client returns at once

    async def pump(self) -> None:
        """Move the engine's chunks into the buffer, up to ``max_buffered_s``; past it, wait for the client.

        A client that takes nothing for ``stall_timeout_s`` while the buffer is full has stopped reading.
        """
        try:
            async for chunk in self.stream:
                if self.abandoned.is_set():
                    return
                self._put(chunk)
                if self._buffered_s > self.max_buffered_s and not await self._drained():
                    logger.warning(
                        f"TTS call #{self.stream.id} cancelled: its client stopped reading "
                        f"({self._buffered_s:.1f} s of audio unsent for {self.stall_timeout_s:g} s)"
                    )
                    self.abandon(
                        RequestError(
                            RequestStatus.RESOURCE_EXHAUSTED,
                            f"the client stopped reading: {self._buffered_s:.1f} s of audio waited for it "
                            f"{self.stall_timeout_s:g} s (limit {self.max_buffered_s:g} s); the call was cancelled",
                        ),
                        "client_stalled",
                    )
                    return
            if not self.abandoned.is_set():
                self._put(None)
        except MagpieSynthesisError as e:
            self._put(RequestError(RequestStatus.INTERNAL, f"synthesis failed: {e}"))

    async def _drained(self) -> bool:
        """Wait until the buffer is back within ``max_buffered_s``.

        Returns:
            False if the client took nothing for ``stall_timeout_s`` meanwhile (it stopped reading), else True.

        """
        while self._buffered_s > self.max_buffered_s and not self.abandoned.is_set():
            self._taken.clear()
            try:
                await asyncio.wait_for(self._taken.wait(), self.stall_timeout_s)
            except TimeoutError:
                return False
        return True

    async def audio(self) -> AsyncIterator[bytes]:
        """int16 mono PCM at the requested rate, each piece as soon as it is made.

        Raises:
            RequestError: The call was abandoned (RESOURCE_EXHAUSTED: the client stopped reading; UNAVAILABLE: the
                server is shutting down) or synthesis failed (INTERNAL).

        """
        while True:
            while not self._items:
                self._ready.clear()
                await self._ready.wait()
            item = self._items.popleft()
            if isinstance(item, RequestError):
                self.outcome = self.outcome or "failed"
                raise item
            if item is None:
                break
            self._buffered_s -= item.duration_s
            self._taken.set()
            audio = self._resampler.push(item.audio)
            if audio:
                self.sent_bytes += len(audio)
                yield audio
        tail = self._resampler.flush()
        if tail:
            self.sent_bytes += len(tail)
            yield tail
        self.outcome = self.outcome or self.stream.status


class Reply:
    """One client call that may carry several requests, spoken in order.

    A Riva ``SynthesizeOnline`` stream: one bot reply, sentence by sentence. Opened with :meth:`TTSHost.reply`.

    Attributes:
        requests: Requests of the call admitted so far. Once one is, the rest are admitted while the host drains:
            a drain ends replies, not sentences.

    """

    def __init__(self) -> None:
        self.requests = 0


class TTSHost:
    """The server's Magpie engine and its synthesis calls: admission, limits, metrics, drain.

    Args:
        config: The engine to create and the limits (default: :class:`TTSHostConfig`).
        metrics: Where to record (default: a new registry).
        engine: An engine to serve instead of creating one (the caller keeps ownership; it must have been
            built for ``config``'s model).

    """

    def __init__(
        self,
        config: TTSHostConfig | None = None,
        metrics: TTSMetrics | None = None,
        engine: MagpieEngine | None = None,
    ) -> None:
        from prometheus_client import CollectorRegistry

        self.config = config or TTSHostConfig()
        self.metrics = metrics or TTSMetrics(CollectorRegistry(auto_describe=True))
        self._owns_engine = engine is None
        self.engine = engine or MagpieEngine(
            self.config.model,
            device=self.config.device,
            codec_model_path=self.config.codec_model_path,
            max_batch=self.config.max_batch,
            dtype=self.config.dtype,
            warmup=self.config.warmup,
        )
        self.ready = False
        self.draining = False
        self._stopped = False
        self._calls: set[SynthesisCall] = set()
        self._replies = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.metrics.capacity.set(self.config.max_streams)
        self.metrics.active_streams.set_function(lambda: float(len(self._calls)))

    @property
    def alive(self) -> bool:
        """False once the model failed to load or the engine's worker stopped (liveness)."""
        return self.engine.load_error is None and self.engine.serving

    @property
    def active_streams(self) -> int:
        """Synthesis calls running now."""
        return len(self._calls)

    @property
    def sample_rate(self) -> int:
        """The codec's output rate, Hz (0 until the model is loaded)."""
        return self.engine.sample_rate

    @property
    def model_name(self) -> str:
        """The served model's file or hub name (never a local directory)."""
        model = self.config.model
        return Path(model).name if model.endswith(".nemo") or Path(model).exists() else model

    async def start(self) -> None:
        """Wait until the model is loaded and warm, then take requests.

        Raises:
            MagpieEngineError: The model failed to load.

        """
        await self.engine.wait_ready()
        self.ready = True
        self.metrics.ready.set(1)
        logger.info(
            f"TTS ready: {self.config.max_streams} synthesis slots, {self.sample_rate} Hz, voices "
            f"{', '.join(VOICES)}"
        )

    async def wait_idle(self) -> None:
        """Return once no synthesis call runs and no client call (:meth:`reply`) is open (at once if none is)."""
        await self._idle.wait()

    def _update_idle(self) -> None:
        if self._calls or self._replies:
            self._idle.clear()
        else:
            self._idle.set()

    @contextlib.asynccontextmanager
    async def reply(self) -> AsyncIterator[Reply]:
        """A client call whose requests (:meth:`synthesize` with ``reply=``) are spoken in order.

        A drain waits for open replies as for running requests, and admits a reply's later requests, so the
        sentences of a reply that began before the drain are all spoken (within ``drain_timeout_s``).
        """
        reply = Reply()
        self._replies += 1
        self._update_idle()
        try:
            yield reply
        finally:
            self._replies -= 1
            self._update_idle()

    def begin_drain(self) -> None:
        """Refuse new calls (UNAVAILABLE) from now on; running ones go on."""
        self.draining = True
        self.ready = False
        self.metrics.ready.set(0)

    async def stop(self, drain_timeout_s: float = 0.0) -> None:
        """Refuse new calls; let running ones and open replies finish for up to ``drain_timeout_s``; end the rest.

        Then close the engine (when the host created it).

        Args:
            drain_timeout_s: How long running calls may go on, s.

        """
        self.begin_drain()
        if (self._calls or self._replies) and drain_timeout_s > 0:
            logger.info(
                f"TTS draining: {len(self._calls)} request(s) running, {self._replies} reply call(s) open, up to "
                f"{drain_timeout_s:g} s"
            )
            try:
                await asyncio.wait_for(self._idle.wait(), drain_timeout_s)
            except (asyncio.TimeoutError, TimeoutError):
                pass
        self._stopped = True
        for call in list(self._calls):
            call.abandon(RequestError(RequestStatus.UNAVAILABLE, "the server is shutting down"), "shutdown")
        if self._owns_engine:
            await asyncio.to_thread(self.engine.close)

    def info(self) -> dict[str, Any]:
        """Facts for ``GET /v1/info``: model, voices, languages, rate, capacity, load."""
        return {
            "model": self.model_name,
            "ready": self.ready,
            "draining": self.draining,
            "device": self.engine.device,
            "sample_rate_hz": self.sample_rate,
            "voices": list(VOICES),
            "languages": list(LANGUAGES),
            "capacity": self.config.max_streams,
            "active_streams": len(self._calls),
        }

    def check(self, request: SynthesisRequest) -> tuple[str, str, MagpieSynthesisOptions]:
        """The voice, language and options of a request, or its refusal.

        Raises:
            RequestError: INVALID_ARGUMENT: empty or too long text, an unknown voice or language, a sample rate
                out of range, a bad seed (each message names the allowed values).

        """
        text = request.text
        if not text.strip() or not any(c.isalnum() for c in text):
            raise RequestError(RequestStatus.INVALID_ARGUMENT, "the text is empty (nothing to speak)")
        if len(text) > self.config.max_text_chars:
            raise RequestError(
                RequestStatus.INVALID_ARGUMENT,
                f"the text has {len(text)} characters; this server takes at most {self.config.max_text_chars} "
                "per request: split it (by sentence) over several requests",
            )
        rate = request.sample_rate_hz
        if rate != 0 and not MIN_OUTPUT_RATE <= rate <= MAX_OUTPUT_RATE:
            raise RequestError(
                RequestStatus.INVALID_ARGUMENT,
                f"sample_rate_hz must be 0 (the model's {self.sample_rate or 22050} Hz) or between "
                f"{MIN_OUTPUT_RATE} and {MAX_OUTPUT_RATE}, got {rate}",
            )
        try:
            voice = normalize_voice(request.voice or self.config.default_voice)
        except ValueError as e:
            raise RequestError(RequestStatus.INVALID_ARGUMENT, str(e)) from None
        try:
            language = normalize_language(request.language or "en")
        except ValueError:
            raise RequestError(
                RequestStatus.INVALID_ARGUMENT,
                f"Magpie does not speak language {request.language!r}; it speaks {', '.join(LANGUAGES)} "
                "(regional codes such as en-US or de-DE are accepted)",
            ) from None
        try:
            options = MagpieSynthesisOptions(max_duration_s=self.config.max_duration_s, seed=request.seed)
        except ValueError as e:
            raise RequestError(RequestStatus.INVALID_ARGUMENT, str(e)) from None
        return voice, language, options

    def refused(self, error: RequestError) -> None:
        """Count a refusal (also the protocol layer's own: bad fields, authentication)."""
        self.metrics.refused.labels(error.status.value).inc()

    def _admit(self, reply: Reply | None) -> None:
        continuing = reply is not None and reply.requests > 0 and self.draining and not self._stopped
        if not self.ready and not continuing:
            what = "draining for shutdown" if self.draining else "still loading the Magpie model"
            raise RequestError(RequestStatus.UNAVAILABLE, f"the server is {what}; retry shortly or use another replica")
        if len(self._calls) >= self.config.max_streams:
            raise RequestError(
                RequestStatus.RESOURCE_EXHAUSTED,
                f"all {self.config.max_streams} synthesis slots of this server are in use; retry later or elsewhere",
            )

    @contextlib.asynccontextmanager
    async def synthesize(self, request: SynthesisRequest, reply: Reply | None = None) -> AsyncIterator[SynthesisCall]:
        """Admit one request and start it; the call ends (its engine row freed) when the block exits.

        Args:
            request: What to speak.
            reply: The client call it belongs to (:meth:`reply`): its requests after the first are admitted while
                the host drains.

        Example::

            async with host.synthesize(SynthesisRequest("Hello there.")) as call:
                async for pcm in call.audio():
                    await send(pcm)

        Raises:
            RequestError: The request is refused (see :meth:`check`; RESOURCE_EXHAUSTED when every slot is
                taken; UNAVAILABLE while loading or draining).

        """
        try:
            voice, language, options = self.check(request)
            self._admit(reply)
            stream = self.engine.submit(request.text, voice=voice, language=language, options=options)
        except RequestError as e:
            self.refused(e)
            raise
        except MagpieEngineError as e:
            error = RequestError(RequestStatus.UNAVAILABLE, f"the TTS engine is not serving: {e}")
            self.refused(error)
            raise error from None
        call = SynthesisCall(
            stream,
            request.sample_rate_hz or self.sample_rate,
            self.sample_rate,
            self.config.max_buffered_s,
            self.config.stall_timeout_s,
        )
        if reply is not None:
            reply.requests += 1
        self._calls.add(call)
        self._update_idle()
        pump = asyncio.get_running_loop().create_task(call.pump(), name=f"tts-call-{stream.id}")
        try:
            yield call
        finally:
            call.outcome = call.outcome or "cancelled"
            stream.cancel()  # a running request stops at its next step; a queued one is skipped
            pump.cancel()
            self._finish(call)

    def _finish(self, call: SynthesisCall) -> None:
        audio_s = call.sent_bytes / 2 / call.out_rate
        self._calls.discard(call)
        self._update_idle()
        stats = call.stream.stats
        self.metrics.requests.labels(call.outcome or "cancelled").inc()
        self.metrics.audio_seconds.inc(audio_s)
        if stats.time_to_first_audio_s is not None:
            self.metrics.first_audio_seconds.observe(stats.time_to_first_audio_s)
        if stats.started_at is not None and audio_s > 0:
            ended = stats.finished_at if stats.finished_at is not None else time.perf_counter()
            self.metrics.real_time_factor.observe((ended - stats.started_at) / audio_s)
        logger.debug(
            f"TTS call #{call.stream.id} ended ({call.outcome}): {audio_s:.2f} s of audio, first audio "
            f"{stats.time_to_first_audio_s or 0.0:.3f} s"
        )
