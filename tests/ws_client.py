"""A raw protocol client for the server tests: connect, open a session, send audio, read what the server sends."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import websockets
from websockets.exceptions import ConnectionClosed

from pipecat_nemotron.server.protocol import PROTOCOL_VERSION, ConfigMessage, parse_server_message

#: 20 ms of 16 kHz int16 per message (as helpers.FRAME_BYTES; helpers imports this module).
FRAME_BYTES = 640


async def connect(url: str, token: str | None = None, **kwargs):
    """A WebSocket to the server speaking the protocol (``Authorization: Bearer token`` if given)."""
    headers = dict(kwargs.pop("headers", {}) or {})
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return await websockets.connect(
        url, additional_headers=headers or None, subprotocols=[PROTOCOL_VERSION], **kwargs
    )


async def open_session(url: str, config: ConfigMessage | None = None, token: str | None = None, **kwargs):
    """Connect, send ``config``; the socket and the server's first message (``ready`` or an error)."""
    ws = await connect(url, token=token, **kwargs)
    await ws.send((config or ConfigMessage()).to_json())
    first = parse_server_message(await asyncio.wait_for(ws.recv(), 10))
    return ws, first


async def stream(ws, pcm: bytes, speed: float = 4.0) -> None:
    """Send ``pcm`` in 20 ms frames at ``speed`` x real time."""
    for i in range(0, len(pcm), FRAME_BYTES):
        await ws.send(pcm[i : i + FRAME_BYTES])
        await asyncio.sleep(0.02 / speed)


async def raw_messages(ws, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Read until the server closes; the JSON messages as sent."""
    messages = []
    with contextlib.suppress(ConnectionClosed):
        async with asyncio.timeout(timeout):
            async for raw in ws:
                if isinstance(raw, str):
                    messages.append(json.loads(raw))
    return messages
