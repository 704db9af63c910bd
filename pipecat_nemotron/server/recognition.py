"""One request-shaped recognition stream (a Riva ``StreamingRecognize`` call): :class:`RecognitionSession`.

No gRPC here: :mod:`~pipecat_nemotron.server.riva_asr` turns the protocol's config into
:class:`RecognitionSettings`, feeds the call's audio to :meth:`RecognitionSession.push`, and sends what
:meth:`RecognitionSession.results` yields.

Riva's clients (Pipecat's ``NvidiaSTTService``) never ask for a final: the server ends an utterance itself
(endpointing). Here an utterance ends once ``stop_history_ms`` of decoded audio has brought no new token after
its last one (the decoder's blanks, as Riva's and NeMo's greedy RNNT endpointing count them), checked after
every engine step; and when the client half-closes its request stream. Both ask the engine for a final
(``ASRStream.request_final``) and wait for it.

Bounds: a client sending audio faster than the engine decodes it has its reads paused while the stream's backlog
is above ``max_backlog_ms`` (gRPC's flow control then holds the client); a client that stops reading its results
fills a buffer of :data:`MAX_PENDING_RESULTS` results, and its call is then ended (RESOURCE_EXHAUSTED) and logged.
The engine never waits for either.
"""

from __future__ import annotations

import asyncio
import collections
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

from loguru import logger

from pipecat_nemotron.asr import ASRStream, StepStats, Transcript
from pipecat_nemotron.asr.errors import InvalidAudioError, NemotronEngineError
from pipecat_nemotron.server.errors import RequestError, RequestStatus

__all__ = ["DEFAULT_STOP_HISTORY_MS", "MAX_PENDING_RESULTS", "RecognitionSession", "RecognitionSettings", "plain_text"]

#: Decoded audio without a new token that ends an utterance when the client sets no ``stop_history``, ms.
DEFAULT_STOP_HISTORY_MS = 800

#: Results a client may leave unread before its call is ended.
MAX_PENDING_RESULTS = 256

_NOT_WORD = re.compile(r"[^\w\s']|(?<!\w)'|'(?!\w)")


def plain_text(text: str) -> str:
    """``text`` without punctuation and capitals (apostrophes inside words kept).

    What Riva sends without its punctuation model (``enable_automatic_punctuation=false``).
    """
    return " ".join(_NOT_WORD.sub(" ", text).lower().split())


@dataclass(frozen=True)
class RecognitionSettings:
    """What one recognition stream asked for, checked against what the server honours.

    Attributes:
        sample_rate: Rate of the client's audio, Hz.
        channels: Interleaved channels of the client's audio (downmixed).
        language: Language to transcribe (None: the engine's default).
        latency_ms: Latency mode (None: the engine's default).
        boost_phrases: Phrases to boost (empty: none).
        boost_alpha: Their weight (None: the engine's default).
        interim_results: Send the utterance's text as it grows, not only its final.
        punctuation: Keep the model's punctuation and capitals (else :func:`plain_text`).
        word_times: Send the final's words with their times and confidence.
        stop_history_ms: Decoded audio without a new token that ends an utterance, ms.

    """

    sample_rate: int
    channels: int = 1
    language: str | None = None
    latency_ms: int | None = None
    boost_phrases: tuple[str, ...] = ()
    boost_alpha: float | None = None
    interim_results: bool = True
    punctuation: bool = True
    word_times: bool = False
    stop_history_ms: int = DEFAULT_STOP_HISTORY_MS


class RecognitionSession:
    """The life of one recognition stream: audio in, endpointing, results out (bounded).

    Register :meth:`on_step` as an engine step listener for the session's life (the server does).

    Args:
        stream: The engine stream, opened with the settings' language, mode and phrases.
        settings: What the client asked for.
        max_backlog_ms: Pause taking audio while the engine holds more of this stream's audio than this, ms.
        name: For logs (no client data).

    """

    def __init__(self, stream: ASRStream, settings: RecognitionSettings, max_backlog_ms: float, name: str) -> None:
        self.stream = stream
        self.settings = settings
        self.max_backlog_ms = max_backlog_ms
        self.name = name
        self.audio_bytes = 0
        self._finals_owed = 0
        self._input_done = False
        self._tokens_seen = 0
        self._last_token_s = 0.0
        self._stepped = asyncio.Event()
        self._results: collections.deque[Transcript | RequestError | None] = collections.deque()
        self._ready = asyncio.Event()
        self._closing = False
        #: Set when the call must end without its client reading on; :attr:`error` then says why.
        self.abandoned = asyncio.Event()
        self.error: RequestError | None = None

    # ---- engine side ---------------------------------------------------------------------------------------

    def on_step(self, stats: StepStats) -> None:
        """Engine step listener: wake a paused reader; end the utterance after ``stop_history_ms`` without a token."""
        self._stepped.set()
        stream = self.stream
        if stream.closed or self._finals_owed:
            return
        tokens = len(stream.tokens)
        if tokens != self._tokens_seen:
            self._tokens_seen = tokens
            self._last_token_s = stream.audio_seconds
            return
        silent_ms = (stream.audio_seconds - self._last_token_s) * 1000.0
        if tokens and silent_ms >= self.settings.stop_history_ms:
            self._request_final()

    def _request_final(self) -> None:
        self._finals_owed += 1
        self.stream.request_final()

    async def collect(self) -> None:
        """Move the stream's updates into the results buffer (the client's reads never hold the engine)."""
        try:
            async for update in self.stream.updates():
                if update.is_final:
                    if not update.forced:
                        self._finals_owed -= 1
                    self._tokens_seen = 0
                    self._last_token_s = self.stream.audio_seconds
                elif not self.settings.interim_results:
                    continue
                if update.text or update.is_final:
                    self._put(update)
                if len(self._results) > MAX_PENDING_RESULTS:
                    logger.warning(f"{self.name}: its client stopped reading results; ending the call")
                    self.fail(
                        RequestError(
                            RequestStatus.RESOURCE_EXHAUSTED,
                            f"the client stopped reading: {MAX_PENDING_RESULTS} results waited for it",
                        )
                    )
                    await self._close()
                    return
                await self._close_if_done()
        except NemotronEngineError as e:
            self.fail(RequestError(RequestStatus.INTERNAL, f"recognition failed: {e}"))
            return
        self._put(None)

    def fail(self, error: RequestError) -> None:
        """End the call with ``error`` (the first reason stays): results still unsent are dropped."""
        if self.error is None:
            self.error = error
        self._results.clear()
        self._put(self.error)
        self.abandoned.set()

    def _put(self, item: Transcript | RequestError | None) -> None:
        self._results.append(item)
        self._ready.set()

    async def _close_if_done(self) -> None:
        if self._input_done and not self._finals_owed:
            await self._close()

    async def _close(self) -> None:
        if not self._closing:
            self._closing = True
            await self.stream.close()

    # ---- client side ---------------------------------------------------------------------------------------

    async def push(self, audio: bytes) -> None:
        """Queue the client's audio; returns once the stream's backlog is under ``max_backlog_ms``.

        Raises:
            RequestError: INVALID_ARGUMENT for unusable audio (the stream then fails alone).

        """
        if not audio or self._closing:
            return
        try:
            await self.stream.push(audio, sample_rate=self.settings.sample_rate, num_channels=self.settings.channels)
        except InvalidAudioError as e:
            raise RequestError(RequestStatus.INVALID_ARGUMENT, str(e)) from None
        self.audio_bytes += len(audio)
        while self.stream.backlog_ms > self.max_backlog_ms and not self.stream.closed:
            self._stepped.clear()
            await self._stepped.wait()

    async def end_of_input(self) -> None:
        """The client half-closed: end the utterance under way (if any), then close once its final is out."""
        self._input_done = True
        if self._closing or self.stream.closed:
            return
        if self.stream.has_pending_speech and not self._finals_owed:
            self._request_final()
        await self._close_if_done()

    async def results(self) -> AsyncIterator[Transcript]:
        """The results to send: partials (if asked for) and finals, in order; ends when the stream closes.

        Raises:
            RequestError: The client stopped reading (RESOURCE_EXHAUSTED), or the stream failed (INTERNAL).

        """
        while True:
            while not self._results:
                self._ready.clear()
                await self._ready.wait()
            item = self._results.popleft()
            if item is None:
                return
            if isinstance(item, RequestError):
                raise item
            yield item

    async def close(self) -> None:
        """Close the stream (idempotent; a final still owed is dropped)."""
        self._closing = True
        await self.stream.close()
