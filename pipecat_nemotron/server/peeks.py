"""A session's ``peek`` answers (the optional v1 feature ``"peek"``), sent without holding up its reader.

A ``peek`` asks the session's stream for the current utterance's text as its final would be now
(:meth:`~pipecat_nemotron.engine.ASRStream.peek`, one batched model step on copies of the stream's state). The
reader only requests it; the answer, a ``peek_result``, is sent when the engine has it. A stream answers its
peeks in order, so the answers go out in the order of the requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from loguru import logger

from pipecat_nemotron.engine import ASRStream, PeekTranscript, StreamClosedError, StreamFailedError
from pipecat_nemotron.server.errors import SessionError
from pipecat_nemotron.server.protocol import CloseCode, PeekResultMessage, ServerMessage


class PeekReplies:
    """Answers one session's ``peek`` messages.

    Args:
        session_id: The session's id, for logs.
        send: The session's one way to send a message.

    """

    def __init__(self, session_id: str, send: Callable[[ServerMessage], Awaitable[None]]) -> None:
        self._session_id = session_id
        self._send = send
        self._tasks: set[asyncio.Task[None]] = set()
        #: Peeks requested so far.
        self.requested = 0

    def request(self, stream: ASRStream) -> None:
        """Ask ``stream`` to peek (covering the audio received so far); the answer is sent when it is ready.

        Raises:
            SessionError: 4500, the stream failed or was closed by the server.

        """
        try:
            future = stream.peek_nowait()
        except StreamFailedError as e:
            raise SessionError(CloseCode.INTERNAL, f"ASR stream failed: {e}") from None
        except StreamClosedError:
            raise SessionError(CloseCode.INTERNAL, "the ASR stream was closed by the server") from None
        self.requested += 1
        task = asyncio.get_running_loop().create_task(self._answer(future))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, future: asyncio.Future[PeekTranscript]) -> None:
        try:
            peek = await future
            await self._send(
                PeekResultMessage(
                    utterance=peek.utterance, text=peek.text, audio_ms=peek.audio_ms, peek_ms=peek.peek_ms
                )
            )
        except Exception as e:  # the stream or the client is gone: the session's reader and writer report it
            logger.debug(f"ASR session {self._session_id}: peek not answered: {e!r}")
