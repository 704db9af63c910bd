"""The aiohttp layer of the ASR server: :class:`ASRServer` and its WebSocket/HTTP handlers.

:class:`ASRServer` puts an :class:`~pipecat_nemotron.server.service.ASRService` behind an aiohttp web
server (endpoints: :mod:`pipecat_nemotron.server.app`). :class:`AiohttpTransport` adapts an aiohttp
WebSocket to the session's :class:`~pipecat_nemotron.server.transport.Transport` (and keeps the heartbeat, which
counts only time spent waiting to read), and :class:`HandshakeGuard` closes connections that do not complete their HTTP request in time (slowloris).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import WSCloseCode, WSMessage, WSMsgType, web
from aiohttp.http_websocket import WebSocketError
from loguru import logger

from pipecat_nemotron.asr import EngineConfig, NemotronEngine
from pipecat_nemotron.server.config import ServerConfig, metrics_tokens_for, throttle_for
from pipecat_nemotron.server.metrics import METRICS_CONTENT_TYPE, ServerMetrics
from pipecat_nemotron.server.protocol import (
    PROTOCOL_VERSION,
    CloseCode,
    ErrorMessage,
    close_reason,
    dump_server_message,
)
from pipecat_nemotron.server.security import HttpAccess, Secret, TokenSet
from pipecat_nemotron.server.service import ASRService
from pipecat_nemotron.server.transport import Incoming, remote_of
from pipecat_nemotron.server.tts_config import TTSHostConfig
from pipecat_nemotron.server.tts_host import TTSHost
from pipecat_nemotron.server.tts_metrics import TTSMetrics

if TYPE_CHECKING:
    from pipecat_nemotron.server.grpc_app import GrpcServer


class _ASRWebSocketResponse(web.WebSocketResponse):
    """aiohttp closes an oversize message's connection with 1009 itself; map that to the protocol's 4009."""

    too_big_message = "message too big"

    async def close(self, *, code: int = WSCloseCode.OK, message: bytes = b"", drain: bool = True) -> bool:
        if code == WSCloseCode.MESSAGE_TOO_BIG:
            code = CloseCode.MESSAGE_TOO_BIG
            reason = close_reason(code)
            message = reason.encode()
            if not self.closed:
                try:
                    text = dump_server_message(
                        ErrorMessage(code=int(code), reason=reason, message=self.too_big_message)
                    )
                    await asyncio.wait_for(self.send_str(text), 1.0)
                except Exception:
                    pass
        return await super().close(code=code, message=message, drain=drain)


class AiohttpTransport:
    """:class:`~pipecat_nemotron.server.transport.Transport` over an aiohttp ``WebSocketResponse``.

    The heartbeat (``heartbeat_s``) is this class's, not aiohttp's: pass ``autoping=False`` and no ``heartbeat``
    to the ``WebSocketResponse``. A client the server has heard nothing from for ``heartbeat_s`` gets a ping; if
    the server then waits ``heartbeat_s / 2`` *to read* without hearing from it (a pong or any other frame),
    the client is gone: the connection is closed without a close frame (1006). Only time spent waiting in
    :meth:`receive` counts towards that half period. While the session holds its reads paused (pacing, backlog),
    the client's pong waits behind its unread messages (TCP keeps order), so that time says nothing about the
    client; aiohttp's heartbeat counts it (only incoming bytes reset it, and none arrive while reads are held)
    and would drop a client that only sent faster than its allowance.

    Args:
        ws: The prepared WebSocket (created with ``autoping=False`` and without aiohttp's ``heartbeat``).
        request: Its HTTP request (its TCP transport tells whether the client is still there).
        heartbeat_s: Silence after which the client is pinged, s (None: no heartbeat).

    """

    def __init__(self, ws: web.WebSocketResponse, request: web.BaseRequest, heartbeat_s: float | None = None) -> None:
        self.ws = ws
        self.request = request
        self.heartbeat_s = heartbeat_s
        #: The close code the client sent (None until its close frame is read; 1006 if it left without one or
        #: answered no ping).
        self.peer_close_code: int | None = None
        self._heard_at = time.monotonic()  # when a frame from the client was last read
        self._unanswered_s: float | None = None  # time spent waiting to read since an unanswered ping, s
        self._ping: asyncio.Task[None] | None = None

    @property
    def closed(self) -> bool:
        """True once closed or closing."""
        return self.ws.closed

    def peer_gone(self) -> bool:
        """True once the TCP connection is closed or closing (reset, FIN, or closed by us), read or not."""
        transport = self.request.transport
        return transport is None or transport.is_closing()

    async def receive(self, timeout: float | None) -> Incoming:
        """Next data message; answers the client's pings and keeps the heartbeat (see the class).

        Raises:
            TimeoutError: No data message within ``timeout`` seconds.

        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait_s = None
            if deadline is not None:
                wait_s = deadline - time.monotonic()
                if wait_s <= 0:
                    raise TimeoutError(f"no message within {timeout:g} s")
            beat_s = self._heartbeat_due_s()
            if beat_s is not None:
                if beat_s <= 0:
                    return self._give_up()
                wait_s = beat_s if wait_s is None else min(wait_s, beat_s)
            started = time.monotonic()
            try:
                msg = await self.ws.receive(timeout=wait_s)
            except (asyncio.TimeoutError, TimeoutError):
                if self._unanswered_s is not None:
                    self._unanswered_s += time.monotonic() - started
                continue
            self._heard_at = time.monotonic()
            self._unanswered_s = None
            if msg.type is WSMsgType.PING:
                try:
                    await self.ws.pong(msg.data)
                except ConnectionError:
                    pass  # closing: the next read returns the close
                continue
            if msg.type is WSMsgType.PONG:
                continue
            return self._incoming(msg)

    def _heartbeat_due_s(self) -> float | None:
        """Time left to wait for the client before the heartbeat acts, s (None: no heartbeat).

        Sends the ping once the client has been silent ``heartbeat_s``; from then on the time left is what remains
        of the half period the client has to answer, counted in time spent waiting to read (0 or less: it is gone).
        """
        if self.heartbeat_s is None:
            return None
        if self._unanswered_s is None:
            due_s = self.heartbeat_s - (time.monotonic() - self._heard_at)
            if due_s > 0:
                return due_s
            self._unanswered_s = 0.0
            self._send_ping()
        return self.heartbeat_s / 2 - self._unanswered_s

    def _send_ping(self) -> None:
        """Ping the client without waiting for the write to drain (a client that stops reading could block it)."""

        async def ping() -> None:
            try:
                await self.ws.ping()
            except Exception as e:  # noqa: BLE001 - closing or closed: the session sees that when it reads
                logger.debug(f"ASR connection from {self._peer()}: ping failed: {e!r}")

        self._ping = asyncio.get_running_loop().create_task(ping(), name="asr-ws-ping")

    def _give_up(self) -> Incoming:
        """The client answered no ping: close its connection without a close frame (1006), as for a lost one."""
        assert self.heartbeat_s is not None
        self.peer_close_code = WSCloseCode.ABNORMAL_CLOSURE
        transport = self.request.transport
        if transport is not None:
            transport.close()
        return Incoming(
            "closed",
            f"heartbeat: nothing from the client, not even a pong, in {self.heartbeat_s / 2:g} s of waiting to "
            "read after a ping; closed the connection as lost (1006)",
        )

    def _peer(self) -> str:
        transport = self.request.transport
        return remote_of(transport.get_extra_info("peername") if transport is not None else None)

    def _incoming(self, msg: WSMessage) -> Incoming:
        """The session's view of a message that is not a ping or pong."""
        if msg.type is WSMsgType.BINARY:
            return Incoming("binary", msg.data)
        if msg.type is WSMsgType.TEXT:
            return Incoming("text", msg.data)
        if msg.type is WSMsgType.ERROR:
            exc = msg.data
            if isinstance(exc, WebSocketError) and exc.code == WSCloseCode.MESSAGE_TOO_BIG:
                return Incoming("too_big", str(exc))
            return Incoming("error", repr(exc))
        if msg.type is WSMsgType.CLOSE and isinstance(msg.data, int):
            self.peer_close_code = msg.data
        elif self.peer_close_code is None:
            # aiohttp reports a connection that ended without a close frame (TCP FIN) as 1000; it is 1006.
            self.peer_close_code = WSCloseCode.ABNORMAL_CLOSURE
        return Incoming("closed")

    async def send_text(self, text: str) -> None:
        """Send a text message (aiohttp raises ``ConnectionResetError`` on a closing connection)."""
        await self.ws.send_str(text)

    async def close(self, code: int, reason: str) -> None:
        """Close with ``code``."""
        if self._ping is not None:
            self._ping.cancel()
        await self.ws.close(code=code, message=reason.encode()[:123])


class ASRServer:
    """The model server: the ASR engine and/or the Magpie TTS engine, over WebSocket + HTTP and Riva gRPC.

    The aiohttp server holds the WebSocket sessions (ASR, ``nemotron-asr.v1``) and the HTTP endpoints (health,
    readiness and metrics of every hosted model) on one port; with ``config.grpc_port`` set, NVIDIA Riva's gRPC API
    (:mod:`~pipecat_nemotron.server.grpc_app`) serves the same engines on a second port. Both models load at
    :meth:`start`; ``/readyz`` answers 200 once every hosted model is ready.

    Example::

        server = ASRServer(EngineConfig(model="tiny.nemo", device="cpu", max_streams=8),
                           ServerConfig(insecure=True, port=0, grpc_port=0), tts=TTSHostConfig(...))
        await server.start()          # returns once the models are warm (wait_ready=True)
        print(server.url, server.grpc_address)   # ws://127.0.0.1:PORT/v1/asr 127.0.0.1:PORT
        ...
        await server.stop()

    Args:
        engine: The ASR engine (or its config) to serve; None: no ASR (a TTS-only server).
        config: Limits and security (both protocols, both models).
        metrics: Metrics registry holder (default: a new one).
        tts: The Magpie TTS to host: a :class:`TTSHost`, or the :class:`TTSHostConfig` to build one from; None: no
            TTS. TTS is served over Riva gRPC only (``config.grpc_port``).

    """

    def __init__(
        self,
        engine: NemotronEngine | EngineConfig | None,
        config: ServerConfig | None = None,
        metrics: ServerMetrics | None = None,
        tts: TTSHost | TTSHostConfig | None = None,
    ) -> None:
        self.config = config or ServerConfig(insecure=True)
        if engine is None and tts is None:
            raise ValueError("the server needs a model to serve: an ASR engine, a TTS model, or both")
        if tts is not None and self.config.grpc_port is None:
            raise ValueError("TTS is served over Riva gRPC only: set a gRPC port (--grpc-port, e.g. 50051)")
        metrics = metrics or ServerMetrics()
        self.service: ASRService | None = (
            ASRService(self.config, engine, metrics) if engine is not None else None
        )
        self.metrics = metrics
        if isinstance(tts, TTSHostConfig):
            tts = TTSHost(tts, TTSMetrics(metrics.registry))
        self.tts: TTSHost | None = tts
        self.grpc: GrpcServer | None = None
        if self.config.grpc_port is not None:
            from pipecat_nemotron.server.grpc_app import GrpcServer  # the [riva] extra: only when asked for

            self.grpc = GrpcServer(self.config, self.config.grpc_port, self.service, self.tts)
        self._guard = HandshakeGuard(self.config.handshake_timeout_s, metrics)
        # /metrics and /v1/info: the ASR service's check (its lockout shared with the sessions), or a TTS-only one.
        self._http_check: Callable[[Secret | None, str], tuple[int, str] | None] = (
            self.service.http_access
            if self.service is not None
            else HttpAccess(metrics_tokens_for(self.config, TokenSet(self.config.tokens)), throttle_for(self.config)).check
        )
        self._server_id = (
            self.service.server_id if self.service is not None else f"{socket.gethostname()}:{os.getpid()}"
        )
        self.app = web.Application(middlewares=[self._guard.middleware])
        routes = [
            web.get("/healthz", self._healthz),
            web.get("/readyz", self._readyz),
            web.get("/metrics", self._metrics),
            web.get("/v1/info", self._info),
        ]
        if self.service is not None:
            routes.append(web.get(self.config.path, self._ws_handler))
        self.app.add_routes(routes)
        self._runner: web.AppRunner | None = None
        self._start_task: asyncio.Task[None] | None = None
        self.port = self.config.port

    @property
    def engine(self) -> NemotronEngine:
        """The served ASR engine.

        Raises:
            RuntimeError: The server hosts no ASR.

        """
        if self.service is None:
            raise RuntimeError("this server hosts no ASR engine (TTS only)")
        return self.service.engine

    @property
    def url(self) -> str:
        """WebSocket URL of a session (after :meth:`start`)."""
        host = self.config.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"ws://{host}:{self.port}{self.config.path}"

    @property
    def http_url(self) -> str:
        """Base HTTP URL (after :meth:`start`)."""
        return self.url.replace("ws://", "http://", 1).removesuffix(self.config.path)

    @property
    def grpc_address(self) -> str | None:
        """``host:port`` of the Riva gRPC API, for Pipecat's ``server=`` (after :meth:`start`); None without it."""
        return self.grpc.address if self.grpc is not None else None

    @property
    def _parts(self) -> list[ASRService | TTSHost]:
        return [p for p in (self.service, self.tts) if p is not None]

    async def start(self, wait_ready: bool = True) -> None:
        """Bind the ports (health endpoints answer at once), then load and warm up the models.

        Args:
            wait_ready: Return only once every model is ready (else they load in the background; ``/readyz``
                tells when).

        Raises:
            ModelLoadError / MagpieEngineError: With ``wait_ready``, when a model cannot be loaded.

        """
        # keepalive_timeout: idle keep-alive connections close after it (and, from aiohttp 3.14.x, a connection
        # that never sends a request too); the HandshakeGuard covers the rest on every aiohttp version.
        self._runner = web.AppRunner(
            self.app,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=self.config.keepalive_timeout_s,
        )
        await self._runner.setup()
        await web.TCPSite(self._runner, self.config.host, self.config.port).start()
        self._guard.start(self._runner.server)
        # The socket address the site bound (the port the OS chose for ``port=0``), via aiohttp's public API.
        addresses = self._runner.addresses
        if addresses:
            self.port = addresses[0][1]
        what = "ASR WebSocket" if self.service is not None else "HTTP"
        logger.info(f"{what} server listening on {self.url} (health on {self.http_url}/healthz)")
        if self.grpc is not None:
            await self.grpc.start()
        self._start_task = asyncio.get_running_loop().create_task(self._start_models(), name="model-start")
        if wait_ready:
            await self._start_task

    async def _start_models(self) -> None:
        await asyncio.gather(*(part.start() for part in self._parts))

    async def wait_ready(self) -> None:
        """Wait until every model is loaded and warm (raises if loading failed)."""
        if self._start_task is not None:
            await self._start_task

    async def stop(self, drain_timeout_s: float | None = None) -> None:
        """Drain (WebSocket sessions and gRPC calls together, up to the drain timeout), stop the engines it owns.

        New sessions and calls are refused from the first moment (4503 / UNAVAILABLE); running ones may finish
        within the drain timeout, then are closed (1001) or cancelled.
        """
        if self._start_task is not None and not self._start_task.done():
            self._start_task.cancel()
        timeout = self.config.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
        if self.tts is not None:
            self.tts.begin_drain()
        drains = []
        if self.grpc is not None:
            drains.append(self.grpc.stop(timeout))
        if self.service is not None:
            drains.append(self.service.stop(timeout, stop_engine=False))
        if self.tts is not None:
            drains.append(self.tts.stop(timeout))
        await asyncio.gather(*drains)
        if self.service is not None:
            await self.service.stop_engine()  # after the gRPC calls, which use it too
        await self._guard.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ASRServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop(drain_timeout_s=0)

    # ---- handlers -----------------------------------------------------------------------------------------

    async def _ws_handler(self, request: web.Request) -> web.StreamResponse:
        ws = _ASRWebSocketResponse(
            # aiohttp refuses a message of exactly max_msg_size bytes; the protocol allows up to and including
            # max_message_bytes.
            max_msg_size=self.config.max_message_bytes + 1,
            autoping=False,  # AiohttpTransport answers pings and keeps the heartbeat
            protocols=(PROTOCOL_VERSION,),
            compress=False,
        )
        ws.too_big_message = f"a message exceeded {self.config.max_message_bytes} bytes; send audio in smaller frames (e.g. 20 ms)"
        await ws.prepare(request)
        assert self.service is not None  # the route exists only with ASR
        await self.service.serve(
            AiohttpTransport(ws, request, self.config.heartbeat_s),
            origin=request.headers.get("Origin"),
            authorization=Secret.of(request.headers.get("Authorization")),
            remote=remote_of(request.remote),
            peer=request.remote or "?",
        )
        return ws

    async def _healthz(self, request: web.Request) -> web.Response:
        # Unauthenticated (load balancers): the status only; the cause is in the server log.
        if self.service is not None and not self.service.alive:
            error = "the model failed to load" if self.service.load_error else "the ASR scheduler crashed"
            return web.json_response({"status": "failed", "error": error}, status=500)
        if self.tts is not None and not self.tts.alive:
            return web.json_response({"status": "failed", "error": "the TTS engine is not serving"}, status=500)
        return web.json_response({"status": "ok"})

    async def _readyz(self, request: web.Request) -> web.Response:
        svc = self.service
        full = svc is not None and self.config.unready_when_full and svc.active_sessions >= svc.max_sessions
        parts = self._parts
        if all(p.ready and p.alive for p in parts) and not full:
            return web.json_response({"status": "ready"})  # unauthenticated: the status only (load: /v1/info)
        draining = any(p.draining for p in parts)
        status = "draining" if draining else ("full" if full else "loading")
        return web.json_response({"status": status}, status=503)

    def _denied(self, request: web.Request) -> web.Response | None:
        denied = self._http_check(Secret.of(request.headers.get("Authorization")), request.remote or "?")
        if denied is None:
            return None
        status, message = denied
        headers = {"WWW-Authenticate": 'Bearer realm="nemotron-asr"'} if status == 401 else {}
        return web.json_response({"error": message}, status=status, headers=headers)

    async def _metrics(self, request: web.Request) -> web.Response:
        denied = self._denied(request)
        if denied is not None:
            return denied
        body = self.metrics.render()
        if self.tts is not None and self.tts.metrics.registry is not self.metrics.registry:
            body += self.tts.metrics.render()  # a TTSHost built on a registry of its own
        return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def _info(self, request: web.Request) -> web.Response:
        denied = self._denied(request)
        if denied is not None:
            return denied
        data = self.service.info() if self.service is not None else {"server_id": self._server_id}
        if self.grpc is not None:
            data["grpc_port"] = self.grpc.port
        if self.tts is not None:
            data["tts"] = self.tts.info()
        return web.json_response(data)


class HandshakeGuard:
    """Closes TCP connections that have not completed an HTTP request within ``timeout_s`` (slowloris).

    aiohttp (before 3.14.x) waits forever for a connection's first request; a half-sent request, or silence,
    would hold a socket, a task and buffers indefinitely. A middleware marks each connection once a request
    is complete; a sweep every ``timeout_s / 4`` (at most 1 s) closes the unmarked ones older than
    ``timeout_s``, so a connection lives at most 1.25 x ``timeout_s`` without a request, however slowly its
    bytes trickle in. Connections that completed a request are left to aiohttp's keep-alive timeout.

    Args:
        timeout_s: Time allowed to complete the first request, s.
        metrics: Where to count closed connections.

    """

    def __init__(self, timeout_s: float, metrics: ServerMetrics) -> None:
        self.timeout_s = timeout_s
        self.metrics = metrics
        self._first_seen: dict[object, float] = {}
        self._served: set[object] = set()
        self._task: asyncio.Task[None] | None = None

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Mark the request's connection as having completed a request."""
        self._served.add(request.protocol)
        return await handler(request)

    def start(self, server: web.Server) -> None:
        """Start sweeping ``server``'s connections."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._sweep(server), name="asr-handshake-guard"
            )

    async def stop(self) -> None:
        """Stop sweeping."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def _sweep(self, server: web.Server) -> None:
        period = min(1.0, self.timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            connections = server.connections
            live = set(connections)
            self._served &= live
            self._first_seen = {c: t for c, t in self._first_seen.items() if c in live}
            closed = 0
            for connection in connections:
                if connection in self._served:
                    continue
                if now - self._first_seen.setdefault(connection, now) >= self.timeout_s:
                    connection.force_close()
                    closed += 1
            if closed:
                self.metrics.handshake_timeouts.inc(closed)
                logger.debug(
                    f"ASR server: closed {closed} connection(s) without a complete request within "
                    f"{self.timeout_s:g} s"
                )
