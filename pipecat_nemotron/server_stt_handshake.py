"""The opening of a :class:`~pipecat_nemotron.server_stt.NemotronServerSTTService` session.

:func:`receive_ready` sends the ``config`` and waits for the server's answer: ``ready``, or an ``error`` and a
close (:class:`ServerRefusedError`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from pipecat_nemotron.server.protocol import (
    ConfigMessage,
    ErrorMessage,
    ReadyMessage,
    parse_server_message,
)


class ServerRefusedError(ConnectionError):
    """The server refused or closed the session with a close code.

    Attributes:
        code: The WebSocket close code (see :class:`~pipecat_nemotron.server.protocol.CloseCode`).

    """

    def __init__(self, code: int | None, message: str) -> None:
        super().__init__(message)
        self.code = code


async def receive_ready(ws: Any, config: ConfigMessage, timeout_s: float) -> ReadyMessage:
    """Send ``config`` on the open WebSocket ``ws`` and return the server's ``ready``.

    Raises:
        ServerRefusedError: The server answered with an ``error`` (after waiting briefly for its close), or
            with something other than ``ready``.
        websockets.exceptions.ConnectionClosed: The server closed the connection without an answer.
        TimeoutError: No answer within ``timeout_s``.

    """
    await ws.send(config.to_json())
    msg = parse_server_message(await asyncio.wait_for(ws.recv(), timeout_s))
    if isinstance(msg, ErrorMessage):
        try:
            await asyncio.wait_for(ws.wait_closed(), 2.0)
        except (asyncio.TimeoutError, TimeoutError):
            pass
        raise ServerRefusedError(msg.code, f"{msg.reason}: {msg.message}")
    if not isinstance(msg, ReadyMessage):
        raise ServerRefusedError(None, f"expected 'ready', got {msg.type!r}")
    return msg
