"""The server STT's peeks in flight: each ``peek`` message sent waits for its answer, in order."""

from __future__ import annotations

import asyncio
from collections import deque


class PeekRequests:
    """A client's peeks over a connection that answers them in order (the server STT's ``peek`` messages)."""

    def __init__(self) -> None:
        self._waiting: deque[asyncio.Future[str]] = deque()

    def request(self) -> asyncio.Future[str]:
        """Register a peek; send its message right after (the answer may arrive before the send returns)."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        return future

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
