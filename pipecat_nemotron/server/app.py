"""The ASR server: one engine, many WebSocket sessions, health/readiness/metrics over HTTP on the same port.

:class:`ASRService` is the framework-independent core (engine lifecycle, admission control, auth, limits,
metrics); :class:`ASRServer` puts it behind an aiohttp web server::

    GET  /v1/asr    WebSocket, protocol nemotron-asr.v1 (docs/PROTOCOL.md)
    GET  /healthz   200 while the process and its scheduler are alive (liveness)
    GET  /readyz    200 once the model is loaded and warm, 503 while loading or draining (readiness)
    GET  /metrics   Prometheus text format (own registry)
    GET  /v1/info   JSON: protocol, model, device, capacity, active sessions

Run it with ``pipecat-nemotron serve`` (:mod:`pipecat_nemotron.cli`).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import os
import socket
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web
from aiohttp.http_websocket import WebSocketError
from loguru import logger

from pipecat_nemotron.engine import EngineConfig, NemotronEngine
from pipecat_nemotron.server.metrics import METRICS_CONTENT_TYPE, ServerMetrics
from pipecat_nemotron.server.protocol import (
    DEFAULT_PATH,
    PROTOCOL_VERSION,
    CloseCode,
    ErrorMessage,
    close_reason,
    dump_server_message,
)
from pipecat_nemotron.server.session import Incoming, Session, Transport, remote_of


def is_loopback(host: str) -> bool:
    """True if ``host`` only accepts connections from this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServerConfig:
    """Limits and security settings of the ASR server (validated on construction).

    Attributes:
        host: Address to bind. ``--insecure`` (no tokens) is only allowed on a loopback address.
        port: TCP port (0 picks a free one; see :attr:`ASRServer.port`).
        path: WebSocket path of a session.
        tokens: Accepted bearer tokens (several allow rotation). Required unless ``insecure``.
        insecure: Accept sessions without a token (loopback only: tests, local development).
        allowed_origins: ``Origin`` values browsers may connect from; ``"*"`` allows any. Requests without an
            ``Origin`` header (non-browser clients) are always allowed.
        max_sessions: Concurrent sessions; default (None) the engine's ``max_streams``. The next connection
            is refused with 4013 while existing sessions keep running.
        max_message_bytes: Largest WebSocket message, bytes (larger: closed with 4009).
        idle_timeout_s: Close a session with 4008 after this long without a message from its client, s.
        config_timeout_s: Close a connection with 4008 that sends no ``config`` within this time, s.
        heartbeat_s: WebSocket ping interval that detects dead peers, s (None: off).
        burst_ms: Audio a client may send ahead of real time before its reads are paused, ms.
        max_speed: Sustained audio rate allowed, x real time (reads are paused beyond it).
        max_backlog_ms: Pause reading a session while the engine holds more of its audio than this, ms.
        backlog_timeout_s: Drop a session with 4029 after its backlog stayed above ``max_backlog_ms`` this long, s.
        send_timeout_s: Drop a session with 4008 when sending it a result blocks this long (it stopped reading), s.
        close_timeout_s: After a client ``close``, wait at most this long for the finals still owed, s.
        drain_timeout_s: On shutdown, let sessions finish for up to this long before closing them with 1001, s.
        unready_when_full: ``/readyz`` answers 503 while every session slot is taken, so a load balancer that
            honours readiness sends new sessions to other replicas.

    """

    host: str = "127.0.0.1"
    port: int = 8765
    path: str = DEFAULT_PATH
    tokens: tuple[str, ...] = ()
    insecure: bool = False
    allowed_origins: tuple[str, ...] = ()
    max_sessions: int | None = None
    max_message_bytes: int = 128 * 1024
    idle_timeout_s: float = 30.0
    config_timeout_s: float = 10.0
    heartbeat_s: float | None = 20.0
    burst_ms: float = 10_000.0
    max_speed: float = 1.0
    max_backlog_ms: float = 5_000.0
    backlog_timeout_s: float = 30.0
    send_timeout_s: float = 10.0
    close_timeout_s: float = 5.0
    drain_timeout_s: float = 30.0
    unready_when_full: bool = False

    def __post_init__(self) -> None:
        if self.insecure and not is_loopback(self.host):
            raise ValueError(
                f"--insecure (no token) is only allowed when binding to loopback (127.0.0.1, ::1, localhost), "
                f"not {self.host!r}; set tokens instead (NEMOTRON_ASR_TOKENS or --token-file)"
            )
        if not self.insecure and not any(t for t in self.tokens):
            raise ValueError(
                "the server needs at least one bearer token (NEMOTRON_ASR_TOKENS or --token-file), or --insecure "
                "on a loopback address"
            )
        if any(len(t) < 16 for t in self.tokens):
            raise ValueError("bearer tokens must be at least 16 characters (e.g. `openssl rand -hex 32`)")
        if self.max_sessions is not None and self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if self.max_message_bytes < 1024:
            raise ValueError(f"max_message_bytes must be >= 1024, got {self.max_message_bytes}")
        for name in (
            "idle_timeout_s",
            "config_timeout_s",
            "send_timeout_s",
            "close_timeout_s",
            "backlog_timeout_s",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0 (seconds), got {getattr(self, name)}")
        if self.burst_ms < 0 or self.max_speed <= 0 or self.max_backlog_ms <= 0:
            raise ValueError("burst_ms must be >= 0, max_speed and max_backlog_ms > 0")
        if not self.path.startswith("/"):
            raise ValueError(f"path must start with '/', got {self.path!r}")


class ASRService:
    """Framework-independent server core: the engine, its sessions, admission control and metrics.

    Args:
        config: Server limits and security.
        engine: An engine to serve (started by :meth:`start` if needed; stopped by :meth:`stop` only if this
            service created it), or the :class:`EngineConfig` to create one from.
        metrics: Where to record metrics (default: a new registry).
        server_id: Name of this server in ``ready`` messages and logs (default: ``hostname:pid``).

    """

    def __init__(
        self,
        config: ServerConfig,
        engine: NemotronEngine | EngineConfig,
        metrics: ServerMetrics | None = None,
        server_id: str | None = None,
    ) -> None:
        self.config = config
        self.server_id = server_id or f"{socket.gethostname()}:{os.getpid()}"
        self._owns_engine = isinstance(engine, EngineConfig)
        self.engine = NemotronEngine(engine) if isinstance(engine, EngineConfig) else engine
        self.metrics = metrics or ServerMetrics()
        self.sessions: dict[str, Session] = {}
        self.ready = False
        self.draining = False
        self.load_error: BaseException | None = None
        self._tokens = tuple(t.encode() for t in config.tokens)
        self._idle = asyncio.Event()
        self._idle.set()
        self._authenticating = 0
        self.metrics.set_backlog_source(
            lambda: max((s.backlog_ms for s in self.sessions.values()), default=0.0) / 1000
        )
        self.metrics.set_stream_source(lambda: float(self.engine.open_streams))
        self.metrics.capacity.set(self.max_sessions)

    @property
    def max_sessions(self) -> int:
        """Session capacity (``max_sessions``, or the engine's ``max_streams``)."""
        return min(self.config.max_sessions or self.engine.config.max_streams, self.engine.config.max_streams)

    @property
    def active_sessions(self) -> int:
        """Sessions admitted and not yet ended."""
        return len(self.sessions)

    @property
    def alive(self) -> bool:
        """False if loading failed or the engine's scheduler crashed (liveness)."""
        if self.load_error is not None:
            return False
        scheduler = getattr(self.engine, "_scheduler", None)
        return scheduler is None or scheduler.error is None

    async def start(self) -> None:
        """Load and warm up the model (if not already), then accept sessions.

        Raises:
            ModelLoadError: The model could not be loaded (also recorded in :attr:`load_error`).

        """
        try:
            await self.engine.start()
        except BaseException as e:
            self.load_error = e
            raise
        self.engine.add_step_listener(self.metrics.observe_step)
        info = self.engine.info
        self.metrics.info.info(
            {
                "model": info.model,
                "device": info.device,
                "dtype": info.dtype,
                "protocol": PROTOCOL_VERSION,
                "latency_modes": ",".join(str(m) for m in info.latency_modes),
            }
        )
        self.metrics.capacity.set(self.max_sessions)
        self.ready = True
        self.metrics.ready.set(1)
        logger.info(f"ASR service ready: {self.max_sessions} session slots, protocol {PROTOCOL_VERSION}")

    async def stop(self, drain_timeout_s: float | None = None) -> None:
        """Stop accepting sessions, let running ones finish (up to the drain timeout), close the rest with 1001.

        Args:
            drain_timeout_s: Override of ``config.drain_timeout_s``, s.

        """
        self.draining = True
        self.ready = False
        self.metrics.ready.set(0)
        timeout = self.config.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
        if self.sessions and timeout > 0:
            logger.info(f"ASR service draining: {len(self.sessions)} session(s), up to {timeout:g} s")
            try:
                await asyncio.wait_for(self._idle.wait(), timeout)
            except (asyncio.TimeoutError, TimeoutError):
                pass
        if self.sessions:
            await asyncio.gather(
                *(
                    s.fail(CloseCode.GOING_AWAY, "the server is shutting down")
                    for s in list(self.sessions.values())
                ),
                return_exceptions=True,
            )
            try:
                await asyncio.wait_for(self._idle.wait(), 5.0)
            except (asyncio.TimeoutError, TimeoutError):
                logger.warning(f"{len(self.sessions)} ASR session(s) did not end within 5 s of being closed")
        if self._owns_engine:
            await self.engine.stop()

    def check_token(self, token: str) -> bool:
        """True if ``token`` is one of the configured tokens (constant-time compare; always True if insecure)."""
        if self.config.insecure and not self._tokens:
            return True
        candidate = token.encode()
        ok = False
        for expected in self._tokens:
            ok |= hmac.compare_digest(candidate, expected)
        return ok

    def origin_allowed(self, origin: str | None) -> bool:
        """True for requests without ``Origin`` (non-browser clients) and for allow-listed origins."""
        if origin is None:
            return True
        allowed = self.config.allowed_origins
        return "*" in allowed or origin.rstrip("/") in {o.rstrip("/") for o in allowed}

    def admission(self, origin: str | None, authorization: str | None) -> tuple[int, str] | None:
        """Connect-time checks, in order: origin, token (if sent in a header), readiness, capacity.

        Args:
            origin: The ``Origin`` header, if any.
            authorization: The ``Authorization`` header, if any.

        Returns:
            None to admit, else ``(close_code, message)``. A connection without an ``Authorization`` header is
            admitted here and must then send a valid ``token`` in its config.

        """
        if not self.origin_allowed(origin):
            return CloseCode.FORBIDDEN_ORIGIN, f"origin {origin!r} is not allowed by this server"
        if authorization is not None and not self._header_ok(authorization):
            return CloseCode.UNAUTHORIZED, "invalid bearer token"
        if not self.ready:
            what = "draining for shutdown" if self.draining else "still loading the model"
            return CloseCode.NOT_READY, f"the server is {what}; retry shortly or use another replica"
        if self.active_sessions >= self.max_sessions:
            return (
                CloseCode.CAPACITY,
                f"all {self.max_sessions} session slots of this server are in use; retry later or elsewhere",
            )
        return None

    def token_checked(self, authorization: str | None) -> bool:
        """True if no further token is needed (insecure, or a valid header was sent)."""
        if self.config.insecure and not self._tokens:
            return True
        return authorization is not None and self._header_ok(authorization)

    def _header_ok(self, authorization: str) -> bool:
        scheme, _, token = authorization.strip().partition(" ")
        return scheme.lower() == "bearer" and bool(token) and self.check_token(token.strip())

    async def refuse(self, transport: Transport, code: int, message: str) -> None:
        """Send an ``error`` message and close a connection that was not admitted; count it."""
        reason = close_reason(code)
        self.metrics.refused.labels(reason).inc()
        logger.info(f"ASR connection refused with {int(code)} ({reason}): {message}")
        try:
            await asyncio.wait_for(
                transport.send_text(
                    dump_server_message(ErrorMessage(code=int(code), reason=reason, message=message))
                ),
                1.0,
            )
        except Exception:
            pass
        try:
            await asyncio.wait_for(transport.close(int(code), reason), 2.0)
        except Exception:
            pass

    async def serve(
        self, transport: Transport, origin: str | None, authorization: str | None, remote: str = "?"
    ) -> None:
        """Admit (or refuse) one accepted WebSocket connection and run its session to the end."""
        refusal = self.admission(origin, authorization)
        if refusal is not None:
            await self.refuse(transport, refusal[0], refusal[1])
            return
        token_checked = self.token_checked(authorization)
        session = Session(self, transport, uuid.uuid4().hex[:12], token_checked=token_checked, remote=remote)
        if not token_checked:
            # No Authorization header: the token comes in the config message. Until then the connection holds
            # no session slot (anonymous connections cannot crowd out authenticated ones), and at most
            # max_sessions of them may wait at once.
            if self._authenticating >= self.max_sessions:
                await self.refuse(
                    transport, CloseCode.CAPACITY, "too many connections waiting to authenticate"
                )
                return
            self._authenticating += 1
            try:
                if not await session.authenticate():
                    return
            finally:
                self._authenticating -= 1
            refusal = self.admission(origin, None)
            if refusal is not None:
                await self.refuse(transport, refusal[0], refusal[1])
                return
        self.sessions[session.session_id] = session
        self._idle.clear()
        self.metrics.sessions.inc()
        self.metrics.active_sessions.set(len(self.sessions))
        try:
            await session.run()
        finally:
            self.sessions.pop(session.session_id, None)
            self.metrics.active_sessions.set(len(self.sessions))
            self.metrics.ended.labels(session.end_how).inc()
            if not self.sessions:
                self._idle.set()

    def info(self) -> dict[str, Any]:
        """Facts for ``GET /v1/info``."""
        data: dict[str, Any] = {
            "protocol": PROTOCOL_VERSION,
            "server_id": self.server_id,
            "path": self.config.path,
            "ready": self.ready,
            "draining": self.draining,
            "capacity": self.max_sessions,
            "active_sessions": self.active_sessions,
        }
        if self.engine.running:
            info = self.engine.info
            data.update(
                model=info.model, device=info.device, dtype=info.dtype, latency_modes=list(info.latency_modes)
            )
        return data


# ---- aiohttp ---------------------------------------------------------------------------------------------


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
    """:class:`~pipecat_nemotron.server.session.Transport` over an aiohttp ``WebSocketResponse``."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws

    @property
    def closed(self) -> bool:
        """True once closed or closing."""
        return self.ws.closed

    async def receive(self, timeout: float | None) -> Incoming:
        """Next data message (pings are answered by aiohttp)."""
        msg = await self.ws.receive(timeout=timeout)
        if msg.type is WSMsgType.BINARY:
            return Incoming("binary", msg.data)
        if msg.type is WSMsgType.TEXT:
            return Incoming("text", msg.data)
        if msg.type is WSMsgType.ERROR:
            exc = msg.data
            if isinstance(exc, WebSocketError) and exc.code == WSCloseCode.MESSAGE_TOO_BIG:
                return Incoming("too_big", str(exc))
            return Incoming("error", repr(exc))
        return Incoming("closed")

    async def send_text(self, text: str) -> None:
        """Send a text message."""
        await self.ws.send_str(text)

    async def close(self, code: int, reason: str) -> None:
        """Close with ``code``."""
        await self.ws.close(code=code, message=reason.encode()[:123])


class ASRServer:
    """The aiohttp server around an :class:`ASRService` (one engine; WebSocket and HTTP on one port).

    Example::

        server = ASRServer(EngineConfig(model="tiny.nemo", device="cpu", max_streams=8),
                           ServerConfig(insecure=True, port=0))
        await server.start()          # returns once the model is warm (wait_ready=True)
        print(server.url)             # ws://127.0.0.1:PORT/v1/asr
        ...
        await server.stop()

    Args:
        engine: The engine (or its config) to serve.
        config: Limits and security.
        metrics: Metrics registry holder (default: a new one).

    """

    def __init__(
        self,
        engine: NemotronEngine | EngineConfig,
        config: ServerConfig | None = None,
        metrics: ServerMetrics | None = None,
    ) -> None:
        self.config = config or ServerConfig(insecure=True)
        self.service = ASRService(self.config, engine, metrics)
        self.app = web.Application()
        self.app.add_routes(
            [
                web.get(self.config.path, self._ws_handler),
                web.get("/healthz", self._healthz),
                web.get("/readyz", self._readyz),
                web.get("/metrics", self._metrics),
                web.get("/v1/info", self._info),
            ]
        )
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._start_task: asyncio.Task[None] | None = None
        self.port = self.config.port

    @property
    def engine(self) -> NemotronEngine:
        """The served engine."""
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

    async def start(self, wait_ready: bool = True) -> None:
        """Bind the port (health endpoints answer at once), then load and warm up the model.

        Args:
            wait_ready: Return only once the model is ready (else it loads in the background; ``/readyz``
                tells when).

        Raises:
            ModelLoadError: With ``wait_ready``, when the model cannot be loaded.

        """
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await self._site.start()
        server = getattr(self._site, "_server", None)
        if server is not None and server.sockets:
            self.port = server.sockets[0].getsockname()[1]
        logger.info(f"ASR server listening on {self.url} (health on {self.http_url}/healthz)")
        self._start_task = asyncio.get_running_loop().create_task(
            self.service.start(), name="asr-engine-start"
        )
        if wait_ready:
            await self._start_task

    async def wait_ready(self) -> None:
        """Wait until the model is loaded and warm (raises if loading failed)."""
        if self._start_task is not None:
            await self._start_task

    async def stop(self, drain_timeout_s: float | None = None) -> None:
        """Drain sessions (see :meth:`ASRService.stop`), stop the engine if owned, and release the port."""
        if self._start_task is not None and not self._start_task.done():
            self._start_task.cancel()
        await self.service.stop(drain_timeout_s)
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
            max_msg_size=self.config.max_message_bytes,
            heartbeat=self.config.heartbeat_s,
            protocols=(PROTOCOL_VERSION,),
            compress=False,
        )
        ws.too_big_message = f"a message exceeded {self.config.max_message_bytes} bytes; send audio in smaller frames (e.g. 20 ms)"
        await ws.prepare(request)
        await self.service.serve(
            AiohttpTransport(ws),
            origin=request.headers.get("Origin"),
            authorization=request.headers.get("Authorization"),
            remote=remote_of(request.remote),
        )
        return ws

    async def _healthz(self, request: web.Request) -> web.Response:
        if not self.service.alive:
            error = self.service.load_error or "the ASR scheduler crashed"
            return web.json_response({"status": "failed", "error": str(error)}, status=500)
        return web.json_response({"status": "ok"})

    async def _readyz(self, request: web.Request) -> web.Response:
        svc = self.service
        full = self.config.unready_when_full and svc.active_sessions >= svc.max_sessions
        if svc.ready and svc.alive and not full:
            return web.json_response(
                {"status": "ready", "free_sessions": svc.max_sessions - svc.active_sessions}
            )
        status = "draining" if svc.draining else ("full" if full else "loading")
        return web.json_response({"status": status}, status=503)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.service.metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE}
        )

    async def _info(self, request: web.Request) -> web.Response:
        return web.json_response(self.service.info())


async def run_server(
    engine_config: EngineConfig, config: ServerConfig, stop: asyncio.Event | None = None
) -> int:
    """Run a server until ``stop`` is set (or SIGINT/SIGTERM), then drain and exit.

    Args:
        engine_config: Engine to load.
        config: Server settings.
        stop: Event that ends the server (default: one set by SIGINT/SIGTERM).

    Returns:
        Process exit code: 0 after a clean shutdown, 1 if the model failed to load.

    """
    import signal

    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - non-Unix or not the main thread
            pass
    server = ASRServer(engine_config, config)
    await server.start(wait_ready=False)
    start_task = server._start_task
    assert start_task is not None
    stop_wait = loop.create_task(stop.wait())
    await asyncio.wait({start_task, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
    if start_task.done() and start_task.exception() is not None:
        logger.error(f"ASR server: the model failed to load: {start_task.exception()}")
        stop_wait.cancel()
        await server.stop(drain_timeout_s=0)
        return 1
    await stop_wait
    logger.info("ASR server: shutdown requested")
    await server.stop()
    return 0


def tokens_from(values: Iterable[str]) -> tuple[str, ...]:
    """Split comma/newline separated token lists, dropping blanks and comments (``#``)."""
    out: list[str] = []
    for value in values:
        for line in value.replace(",", "\n").splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                out.append(line)
    return tuple(out)
