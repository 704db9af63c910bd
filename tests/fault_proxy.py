"""A WebSocket proxy on loopback that misbehaves on cue, in front of a real ASR server (reconnect tests).

Each new connection takes the next action of its plan (then ``forward`` for ever):

* ``http500``, ``http503``, ``http401``...: refuse the WebSocket upgrade with that HTTP status;
* ``close4013``, ``close4503``, ``close4500``...: accept, answer the client's ``config`` with the protocol's
  ``error`` message and close with that code (a server refusing the session);
* ``drop``: forward the session, then cut the connection (no close frame: 1006) once the client has sent
  ``drop_after_bytes`` of audio;
* ``dropforced``: forward the session, then cut the connection (1006) right after forwarding the first forced
  ``final`` (an utterance split at the server's ``max_utterance_s``);
* ``end4500``: forward the session, then close it with 4500 once ``drop_after_bytes`` were sent (the server
  ending a session on purpose);
* ``forward``: a transparent proxy to the upstream server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from http import HTTPStatus
from typing import Any

import websockets
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed

from pipecat_nemotron.server.protocol import PROTOCOL_VERSION, ErrorMessage, close_reason, dump_server_message


class FaultProxy:
    """Serve on ``127.0.0.1`` (``url``), forwarding to ``upstream`` except where the plan says otherwise."""

    def __init__(self, upstream: str, plan: list[str], drop_after_bytes: int = 16000) -> None:
        self.upstream = upstream
        self.plan = deque(plan)
        self.drop_after_bytes = drop_after_bytes
        self.done: list[str] = []
        self.url = ""
        self._server: Any = None

    async def __aenter__(self) -> FaultProxy:
        self._server = await serve(
            self._handle, "127.0.0.1", 0, process_request=self._upgrade, subprotocols=[PROTOCOL_VERSION]
        )
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"ws://127.0.0.1:{port}/v1/asr"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        await self._server.wait_closed()

    def _upgrade(self, connection: Any, request: Any) -> Any:
        action = self.plan[0] if self.plan else "forward"
        if not action.startswith("http"):
            return None
        self.done.append(self.plan.popleft())
        return connection.respond(HTTPStatus(int(action[4:])), "refused by the fault proxy\n")

    async def _handle(self, ws: Any) -> None:
        action = self.plan.popleft() if self.plan else "forward"
        self.done.append(action)
        if action.startswith("close"):
            code = int(action[5:])
            with contextlib.suppress(ConnectionClosed):
                await ws.recv()  # the config
                await ws.send(dump_server_message(ErrorMessage(code=code, reason=close_reason(code), message="fault")))
                await ws.close(code, close_reason(code))
            return
        headers = {k: v for k, v in ws.request.headers.items() if k.lower() == "authorization"}
        async with websockets.connect(
            self.upstream, additional_headers=headers or None, subprotocols=[PROTOCOL_VERSION]
        ) as up:
            await self._pump(ws, up, action)

    async def _pump(self, ws: Any, up: Any, action: str) -> None:
        sent = 0

        async def client_to_server() -> None:
            nonlocal sent
            async for message in ws:
                await up.send(message)
                if isinstance(message, bytes):
                    sent += len(message)
                    if action in ("drop", "end4500") and sent >= self.drop_after_bytes:
                        return

        async def server_to_client() -> None:
            async for message in up:
                await ws.send(message)
                if action == "dropforced" and isinstance(message, str) and json.loads(message).get("forced"):
                    return

        tasks = [asyncio.create_task(client_to_server()), asyncio.create_task(server_to_client())]
        with contextlib.suppress(ConnectionClosed):
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if action in ("drop", "dropforced"):
            ws.transport.abort()  # no close frame: the client sees 1006
        elif action == "end4500":
            with contextlib.suppress(ConnectionClosed):
                await ws.send(dump_server_message(ErrorMessage(code=4500, reason="internal", message="fault")))
                await ws.close(4500, "internal")
        else:
            await ws.close()
