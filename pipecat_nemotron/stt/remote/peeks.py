"""The server STT's peeks in flight: each ``peek`` message sent waits for its answer, in order."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from pipecat_nemotron.server.protocol import PEEK_FEATURE, PeekMessage, ReadyMessage


class PeekRequests:
    """A client's peeks over a connection that answers them in order (the server STT's ``peek`` messages)."""

    def __init__(self) -> None:
        self._waiting: deque[asyncio.Future[str]] = deque()

    def request(self) -> asyncio.Future[str]:
        """Register a peek; send its message right after (the answer may arrive before the send returns)."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        return future

    async def round_trip(self, ws: Any, ready: ReadyMessage | None, lock: asyncio.Lock, timeout_s: float) -> str:
        """Send a ``peek`` on ``ws`` (under the sender's ``lock``) and wait for its answer, at most ``timeout_s``.

        Returns "" while disconnected, or from a server without the ``peek`` feature.
        """
        if ws is None or ready is None or PEEK_FEATURE not in ready.features:
            return ""
        async with lock:  # after the audio sent so far, which it covers
            answer = self.request()
            await ws.send(PeekMessage().to_json())
        return await asyncio.wait_for(answer, timeout_s)

    def answer(self, text: str) -> None:
        """The answer to the oldest peek arrived (dropped if its asker stopped waiting)."""
        if self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_result(text)

    def clear(self) -> None:
        """The connection closed: no answer will come for the peeks still waiting."""
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_exception(ConnectionError("the connection closed before the peek was answered"))
