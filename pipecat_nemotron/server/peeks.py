"""A session's ``peek`` answers (the optional v1 feature ``"peek"``), sent without holding up its reader.

A ``peek`` asks the session's stream for the current utterance's text as its final would be now
(:meth:`~pipecat_nemotron.asr.ASRStream.peek`, one batched model step on copies of the stream's state). The
reader only requests it; the answer, a ``peek_result``, is sent when the engine has it, in the order of the
requests, exactly one per ``peek``.

Peeks are coalesced, so a client cannot buy more engine work with them than one peek at a time: a session has
at most one engine peek in flight. Peeks that arrive meanwhile wait, and are all answered by the one engine peek
issued when the one in flight is answered; it covers every sample received by then, so each of them still covers
at least the audio sent before it. A peek with no audio received and no ``finalize`` since the last engine peek
is answered with that peek's text, without a model step. Waiting peeks are issued before a ``finalize`` (see
:meth:`PeekReplies.before_finalize`): a peek is about the utterance it was sent in.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from loguru import logger

from pipecat_nemotron.asr import ASRStream, StreamClosedError, StreamFailedError, Transcript
from pipecat_nemotron.server.errors import SessionError
from pipecat_nemotron.server.protocol import CloseCode, PeekResultMessage, ServerMessage

#: What a peek covers: (audio bytes received by the session, finalizes requested before it).
PeekKey = tuple[int, int]


@dataclass
class _Batch:
    """One engine peek and the client peeks it answers (their request times, monotonic s, in order)."""

    key: PeekKey
    future: asyncio.Future[Transcript]
    requested_at: list[float] = field(default_factory=list)


class PeekReplies:
    """Answers one session's ``peek`` messages.

    Args:
        session_id: The session's id, for logs.
        send: The session's one way to send a message.

    """

    def __init__(self, session_id: str, send: Callable[[ServerMessage], Awaitable[None]]) -> None:
        self._session_id = session_id
        self._send = send
        self._batches: deque[_Batch] = deque()
        self._waiting: list[float] = []
        self._last: tuple[PeekKey, Transcript] | None = None
        self._stream: ASRStream | None = None
        self._key: PeekKey = (0, 0)
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        #: Peeks requested so far.
        self.requested = 0
        #: Peeks answered so far.
        self.answered = 0
        #: Engine peeks (model-step flushes) asked for so far: at most :attr:`requested`.
        self.engine_peeks = 0

    @property
    def owed(self) -> int:
        """Peeks requested but not answered yet."""
        return self.requested - self.answered

    def request(self, stream: ASRStream, key: PeekKey) -> None:
        """Answer a ``peek`` (covering the audio received so far) once the engine has it.

        Args:
            stream: The session's stream.
            key: What the session has received: ``(audio bytes, finalizes)``; equal keys cover the same audio.

        Raises:
            SessionError: 4500, the stream failed or was closed by the server.

        """
        self.requested += 1
        self._idle.clear()
        self._stream, self._key = stream, key
        self._waiting.append(time.monotonic())
        if not self._batches:
            self._issue()

    def before_finalize(self) -> None:
        """Issue the waiting peeks now: they are about the utterance a ``finalize`` is about to end.

        Raises:
            SessionError: 4500, the stream failed or was closed by the server.

        """
        if self._waiting:
            self._issue()

    async def wait_answered(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until every peek requested so far is answered; whether they were."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except (asyncio.TimeoutError, TimeoutError):
            return False
        return self.owed == 0

    def _issue(self) -> None:
        """Ask the engine one peek for every waiting request (or reuse the last answer if nothing changed)."""
        stream, key = self._stream, self._key
        assert stream is not None
        waiting, self._waiting = self._waiting, []
        loop = asyncio.get_running_loop()
        if self._last is not None and self._last[0] == key:
            future: asyncio.Future[Transcript] = loop.create_future()
            future.set_result(self._last[1])
        else:
            try:
                future = stream.peek_nowait()
            except StreamFailedError as e:
                raise SessionError(CloseCode.INTERNAL, f"ASR stream failed: {e}") from None
            except StreamClosedError:
                raise SessionError(CloseCode.INTERNAL, "the ASR stream was closed by the server") from None
            self.engine_peeks += 1
        self._batches.append(_Batch(key, future, waiting))
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._answer(), name=f"asr-session-{self._session_id}-peeks")

    async def _answer(self) -> None:
        """Send the answers of each engine peek in order; issue the peeks that waited for it."""
        try:
            while self._batches:
                batch = self._batches[0]
                peek = await batch.future
                self._last = (batch.key, peek)
                for requested_at in batch.requested_at:
                    await self._send(
                        PeekResultMessage(
                            utterance=peek.utterance,
                            text=peek.text,
                            utterance_audio_ms=peek.utterance_audio_ms,
                            peek_ms=(time.monotonic() - requested_at) * 1000.0,
                        )
                    )
                    self.answered += 1
                self._batches.popleft()
                if not self._batches and self._waiting:
                    self._issue()
            self._idle.set()
        except Exception as e:  # the stream or the client is gone: the session's reader and writer report it
            logger.debug(f"ASR session {self._session_id}: {self.owed} peek(s) not answered: {e!r}")
            self._batches.clear()
            self._waiting.clear()
            self._idle.set()
