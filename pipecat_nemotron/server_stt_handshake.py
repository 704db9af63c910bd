"""The opening of a :class:`~pipecat_nemotron.server_stt.NemotronServerSTTService` session.

:func:`receive_ready` sends the ``config`` and waits for the server's answer: ``ready``, or an ``error`` and a
close (:class:`ServerRefusedError`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from websockets.exceptions import ConnectionClosed

from pipecat_nemotron.server.protocol import (
    ConfigMessage,
    ErrorMessage,
    ReadyMessage,
    close_reason,
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
        ServerRefusedError: The server answered with an ``error`` (after waiting briefly for its close), with
            something other than ``ready``, or closed the connection without an answer.
        TimeoutError: No answer within ``timeout_s``.

    """
    try:
        await ws.send(config.to_json())
        text = await asyncio.wait_for(ws.recv(), timeout_s)
    except ConnectionClosed as e:
        code = e.rcvd.code if e.rcvd is not None else None
        reason = e.rcvd.reason if e.rcvd is not None else ""
        raise ServerRefusedError(code, f"the server closed the connection ({close_reason(code or 1006)}): {reason}") from e
    msg = parse_server_message(text)
    if isinstance(msg, ErrorMessage):
        try:
            await asyncio.wait_for(ws.wait_closed(), 2.0)
        except (asyncio.TimeoutError, TimeoutError):
            pass
        raise ServerRefusedError(msg.code, f"{msg.reason}: {msg.message}")
    if not isinstance(msg, ReadyMessage):
        raise ServerRefusedError(None, f"expected 'ready', got {msg.type!r}")
    return msg


def audio_message_bytes(ready: ReadyMessage, cap: int) -> int:
    """Largest audio message to send on the session ``ready`` opened, bytes (even: whole 16-bit samples).

    The server's announced ``max_message_bytes`` (inclusive; larger closes with 4009), at most ``cap``.
    """
    limit = int(ready.limits.get("max_message_bytes", cap)) if ready.limits else 0
    limit = limit if limit > 0 else cap
    return max(2, min(limit, cap) // 2 * 2)
