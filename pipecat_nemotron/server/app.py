"""The ASR server: one engine, many WebSocket sessions, health/readiness/metrics over HTTP on the same port.

:class:`ASRService` is the framework-independent core (engine lifecycle, admission control, auth, limits,
metrics); :class:`ASRServer` puts it behind an aiohttp web server::

    GET  /v1/asr    WebSocket, protocol nemotron-asr.v1 (docs/PROTOCOL.md)
    GET  /healthz   200 while the process and its scheduler are alive (liveness)
    GET  /readyz    200 once the model is loaded and warm, 503 while loading or draining (readiness)
    GET  /metrics   Prometheus text format (own registry); bearer token unless ``public_metrics``
    GET  /v1/info   JSON: protocol, model, device, capacity, active sessions; same auth as /metrics

Connection-level guards: a connection must complete its HTTP request (the WebSocket upgrade) within
``handshake_timeout_s`` and an idle HTTP keep-alive connection is closed after ``keepalive_timeout_s``, so
half-sent requests cannot pile up (slowloris).

Run it with ``pipecat-nemotron serve`` (:mod:`pipecat_nemotron.cli`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web
from aiohttp.http_websocket import WebSocketError
from loguru import logger

from pipecat_nemotron.engine import EngineConfig, NemotronEngine
from pipecat_nemotron.server.metrics import METRICS_CONTENT_TYPE, ServerMetrics
from pipecat_nemotron.server.protocol import (
    AUTH_BACKOFF_REASON,
    DEFAULT_PATH,
    PROTOCOL_VERSION,
    CloseCode,
    ErrorMessage,
    close_reason,
    dump_server_message,
)
from pipecat_nemotron.server.security import (
    AuthThrottle,
    HiddenTokens,
    PendingAuth,
    Secret,
    TokenSet,
    log_safe,
    peer_key,
    round_up,
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

    ``repr`` never shows the tokens (only how many there are): configs end up in logs and in the variables
    that loguru prints with a crash's traceback.

    Attributes:
        host: Address to bind. ``--insecure`` (no tokens) is only allowed on a loopback address.
        port: TCP port (0 picks a free one; see :attr:`ASRServer.port`).
        path: WebSocket path of a session.
        tokens: Accepted bearer tokens (several allow rotation). Required unless ``insecure``. Stored as a
            :class:`~pipecat_nemotron.server.security.HiddenTokens` tuple.
        insecure: Accept sessions without a token (loopback only: tests, local development).
        metrics_token: Bearer token for ``/metrics`` and ``/v1/info`` (then only it works there). None: the
            session tokens work there (a server without any token serves them openly).
        public_metrics: Serve ``/metrics`` and ``/v1/info`` without a token (they show the model, device and
            server id; only behind a network boundary you trust).
        allowed_origins: ``Origin`` values browsers may connect from; ``"*"`` allows any. Requests without an
            ``Origin`` header (non-browser clients) are always allowed.
        max_sessions: Concurrent sessions; default (None) the engine's ``max_streams``. The next connection
            is refused with 4013 while existing sessions keep running.
        max_pending_auth: Connections without an ``Authorization`` header that may wait for their config
            (and its token) at once; default (None) the session capacity, at least 16. When full, the oldest
            pending connection of the peer holding the most is evicted (4013), see
            :class:`~pipecat_nemotron.server.security.PendingAuth`.
        max_message_bytes: Largest WebSocket message, bytes, inclusive (larger: closed with 4009).
        idle_timeout_s: Close a session with 4008 after this long without a message from its client, s.
        config_timeout_s: Close a connection with 4008 that sends no ``config`` within this time, s.
        handshake_timeout_s: Close a TCP connection that has not completed its HTTP request (the WebSocket
            upgrade, or a request to an HTTP endpoint) within this time, s. Bytes trickling in do not extend it.
        keepalive_timeout_s: Close an HTTP keep-alive connection idle this long after a response, s.
        heartbeat_s: WebSocket ping interval that detects dead peers, s (None: off).
        burst_ms: Audio a client may send ahead of real time before its reads are paused, ms.
        max_speed: Sustained audio rate allowed, x real time (reads are paused beyond it).
        max_control_rate: Sustained rate of JSON control messages (finalize, set_latency, keepalive) allowed
            per session, messages per second (reads are paused beyond it).
        control_burst: Control messages a session may send at once before the rate applies.
        max_backlog_ms: Pause reading a session while the engine holds more of its audio than this, ms.
        backlog_timeout_s: Drop a session with 4029 after its backlog stayed above ``max_backlog_ms`` this long, s.
        send_timeout_s: Drop a session with 4008 when sending it a result blocks this long (it stopped reading), s.
        close_timeout_s: After a client ``close``, wait at most this long for the finals still owed, s.
        drain_timeout_s: On shutdown, let sessions finish for up to this long before closing them with 1001, s.
        unready_when_full: ``/readyz`` answers 503 while every session slot is taken, so a load balancer that
            honours readiness sends new sessions to other replicas.
        auth_max_failures: Failed authentications (wrong or missing token) from one peer (IPv4 address or
            IPv6 /64) within ``auth_failure_window_s`` that lock it out; 0 disables the lockout (e.g. behind a
            proxy that hides client addresses, where every client would share one peer).
        auth_failure_window_s: Window in which failures count, s.
        auth_backoff_s: First lockout, s; a locked-out peer's connections are refused with 4029
            (``auth_backoff``) before anything is read. Each failure after a lockout doubles it.
        auth_backoff_max_s: Longest lockout, s.

    """

    host: str = "127.0.0.1"
    port: int = 8765
    path: str = DEFAULT_PATH
    tokens: tuple[str, ...] = field(default=(), repr=False)
    insecure: bool = False
    metrics_token: str | None = field(default=None, repr=False)
    public_metrics: bool = False
    allowed_origins: tuple[str, ...] = ()
    max_sessions: int | None = None
    max_pending_auth: int | None = None
    max_message_bytes: int = 128 * 1024
    idle_timeout_s: float = 30.0
    config_timeout_s: float = 10.0
    handshake_timeout_s: float = 10.0
    keepalive_timeout_s: float = 15.0
    heartbeat_s: float | None = 20.0
    burst_ms: float = 10_000.0
    max_speed: float = 1.0
    max_control_rate: float = 20.0
    control_burst: int = 100
    max_backlog_ms: float = 5_000.0
    backlog_timeout_s: float = 30.0
    send_timeout_s: float = 10.0
    close_timeout_s: float = 5.0
    drain_timeout_s: float = 30.0
    unready_when_full: bool = False
    auth_max_failures: int = 5
    auth_failure_window_s: float = 60.0
    auth_backoff_s: float = 10.0
    auth_backoff_max_s: float = 600.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", HiddenTokens(self.tokens))
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
        if self.metrics_token is not None and len(self.metrics_token) < 16:
            raise ValueError("the metrics token must be at least 16 characters (e.g. `openssl rand -hex 32`)")
        if self.metrics_token is not None and self.public_metrics:
            raise ValueError("set either a metrics token or public metrics (--public-metrics), not both")
        if self.max_sessions is not None and self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if self.max_pending_auth is not None and self.max_pending_auth < 1:
            raise ValueError(f"max_pending_auth must be >= 1, got {self.max_pending_auth}")
        if self.max_message_bytes < 1024:
            raise ValueError(f"max_message_bytes must be >= 1024, got {self.max_message_bytes}")
        for name in (
            "idle_timeout_s",
            "config_timeout_s",
            "handshake_timeout_s",
            "keepalive_timeout_s",
            "send_timeout_s",
            "close_timeout_s",
            "backlog_timeout_s",
            "max_control_rate",
            "auth_failure_window_s",
            "auth_backoff_s",
            "auth_backoff_max_s",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.control_burst < 1:
            raise ValueError(f"control_burst must be >= 1 (messages), got {self.control_burst}")
        if self.auth_max_failures < 0:
            raise ValueError(f"auth_max_failures must be >= 0 (0: no lockout), got {self.auth_max_failures}")
        if self.burst_ms < 0 or self.max_speed <= 0 or self.max_backlog_ms <= 0:
            raise ValueError("burst_ms must be >= 0, max_speed and max_backlog_ms > 0")
        if not self.path.startswith("/"):
            raise ValueError(f"path must start with '/', got {self.path!r}")

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr)
        metrics_token = "'<hidden>'" if self.metrics_token else None
        return f"ServerConfig({shown}, tokens={self.tokens!r}, metrics_token={metrics_token})"


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
        # Only digests of the tokens are kept (TokenSet): nothing here can print a token.
        self._tokens = TokenSet(config.tokens)
        if config.metrics_token is not None:
            self._metrics_tokens: TokenSet | None = TokenSet([config.metrics_token])
        elif config.public_metrics or not len(self._tokens):
            self._metrics_tokens = None  # open: asked for, or a tokenless (loopback-only) server
        else:
            self._metrics_tokens = self._tokens
        self._throttle = AuthThrottle(
            config.auth_max_failures,
            config.auth_failure_window_s,
            config.auth_backoff_s,
            config.auth_backoff_max_s,
        )
        self._idle = asyncio.Event()
        self._idle.set()
        self._pending: PendingAuth[Session] = PendingAuth(self.max_pending_auth)
        self._tasks: set[asyncio.Task[None]] = set()
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
        """Sessions holding a slot: admitted, not ending, and whose client is still connected.

        A session whose client has gone no longer counts, even before its task has noticed (its reads may be
        paused): a client that reconnects at once must not find its own old session in the way.
        """
        return sum(1 for s in self.sessions.values() if s.holds_slot)

    @property
    def max_pending_auth(self) -> int:
        """Connections that may wait to authenticate in their config at once (see ``ServerConfig``)."""
        return self.config.max_pending_auth or max(16, self.max_sessions)

    @property
    def pending_auth(self) -> int:
        """Connections waiting to authenticate in their config now."""
        return len(self._pending)

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

    def check_token(self, token: str | Secret | None) -> bool:
        """True if ``token`` is one of the configured tokens (constant-time compare; always True if insecure).

        Any text is safe to pass, including lone surrogates (from undecodable header bytes or a JSON escape):
        it just does not match.
        """
        if self.config.insecure and not len(self._tokens):
            return True
        return self._tokens.matches(token)

    def origin_allowed(self, origin: str | None) -> bool:
        """True for requests without ``Origin`` (non-browser clients) and for allow-listed origins."""
        if origin is None:
            return True
        allowed = self.config.allowed_origins
        return "*" in allowed or origin.rstrip("/") in {o.rstrip("/") for o in allowed}

    def admission(self, origin: str | None, authorization: Secret | str | None) -> tuple[int, str] | None:
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
        if authorization is not None and not self._header_ok(Secret.of(authorization)):
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

    def token_checked(self, authorization: Secret | str | None) -> bool:
        """True if no further token is needed (insecure, or a valid header was sent)."""
        if self.config.insecure and not len(self._tokens):
            return True
        return authorization is not None and self._header_ok(Secret.of(authorization))

    def _header_ok(self, authorization: Secret | None) -> bool:
        return self._tokens.matches_header(authorization)

    def http_access(self, authorization: Secret | None, peer: str) -> tuple[int, str] | None:
        """Whether a ``/metrics`` or ``/v1/info`` request may be answered.

        Args:
            authorization: The ``Authorization`` header, if any.
            peer: The client's address (for the failed-authentication lockout).

        Returns:
            None to answer, else ``(http_status, message)``: 401 without a valid bearer token, 429 while the
            peer is locked out after failed authentications.

        """
        if self._metrics_tokens is None:
            return None
        key = peer_key(peer)
        locked_s = self._throttle.retry_after(key)
        if locked_s > 0:
            return (
                429,
                f"too many failed authentications from this address; retry after {round_up(locked_s)} s",
            )
        if self._metrics_tokens.matches_header(authorization):
            self._throttle.succeeded(key)
            return None
        if authorization is not None:
            self._auth_failed(key)
        return 401, "a bearer token is required (Authorization: Bearer <token>)"

    def _auth_failed(self, peer: str) -> None:
        lockout_s = self._throttle.failed(peer)
        if lockout_s > 0:
            logger.warning(
                f"ASR server: peer {log_safe(peer)} failed authentication too often; refusing it for {lockout_s:g} s"
            )

    async def engine_slot_freed(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for an engine stream slot while a session that has lost its client ends.

        Returns:
            True once a slot is free; False at the timeout, or at once if no session is ending.

        """
        engine = self.engine
        deadline = time.monotonic() + timeout_s
        while engine.open_streams >= engine.config.max_streams:
            ending = any(not s.holds_slot and s.stream is not None for s in self.sessions.values())
            if not ending or time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    async def refuse(self, transport: Transport, code: int, message: str, reason: str | None = None) -> None:
        """Send an ``error`` message and close a connection that was not admitted; count it.

        Args:
            transport: The connection.
            code: Close code.
            message: Explanation for the client.
            reason: Machine-readable reason (default: the close code's).

        """
        reason = reason or close_reason(code)
        self.metrics.refused.labels(reason).inc()
        # A locked-out peer's refusals are cheap and may come by the thousand: the lockout itself is the
        # WARNING, each refusal only DEBUG.
        log = logger.debug if reason == AUTH_BACKOFF_REASON else logger.info
        log(f"ASR connection refused with {int(code)} ({reason}): {log_safe(message, 300)}")
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
        self,
        transport: Transport,
        origin: str | None,
        authorization: Secret | str | None,
        remote: str = "?",
        peer: str | None = None,
    ) -> None:
        """Admit (or refuse) one accepted WebSocket connection and run its session to the end.

        Args:
            transport: The accepted connection.
            origin: The ``Origin`` header, if any.
            authorization: The ``Authorization`` header, if any (wrap it in :class:`Secret` at once).
            remote: Client address, for logs.
            peer: Client IP address, for per-peer limits (default: ``remote``).

        """
        authorization = Secret.of(authorization)
        key = peer_key(peer or remote)
        locked_s = self._throttle.retry_after(key)
        if locked_s > 0:  # refused before reading anything: a locked-out peer costs one handshake
            await self.refuse(
                transport,
                CloseCode.BACKLOG,
                f"too many failed authentications from this address; retry after {round_up(locked_s)} s",
                reason=AUTH_BACKOFF_REASON,
            )
            return
        refusal = self.admission(origin, authorization)
        if refusal is not None:
            if refusal[0] == CloseCode.UNAUTHORIZED:
                self._auth_failed(key)
            await self.refuse(transport, refusal[0], refusal[1])
            return
        token_checked = self.token_checked(authorization)
        if token_checked and authorization is not None:
            self._throttle.succeeded(key)
        session = Session(self, transport, uuid.uuid4().hex[:12], token_checked=token_checked, remote=remote)
        if not token_checked:
            # No Authorization header: the token comes in the config message. Until then the connection holds
            # no session slot (anonymous connections cannot crowd out authenticated ones), and at most
            # max_pending_auth of them wait at once; a newcomer evicts from the peer holding the most.
            evicted = self._pending.add(session, key)
            if evicted is not None:
                self._spawn(
                    evicted.evict(
                        "too many connections waiting to authenticate; send the config message (with its "
                        "token) right after connecting"
                    )
                )
            try:
                authenticated = await session.authenticate()
            finally:
                self._pending.remove(session)
            if not authenticated:
                if session.close_code == CloseCode.UNAUTHORIZED:
                    self._auth_failed(key)
                return
            if session.close_code is not None:  # evicted while its config was arriving
                return
            self._throttle.succeeded(key)
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

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` in the background, keeping a reference until it ends."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
    """:class:`~pipecat_nemotron.server.session.Transport` over an aiohttp ``WebSocketResponse``.

    Args:
        ws: The prepared WebSocket.
        request: Its HTTP request (its TCP transport tells whether the client is still there).

    """

    def __init__(self, ws: web.WebSocketResponse, request: web.BaseRequest) -> None:
        self.ws = ws
        self.request = request

    @property
    def closed(self) -> bool:
        """True once closed or closing."""
        return self.ws.closed

    def peer_gone(self) -> bool:
        """True once the TCP connection is closed or closing (reset, FIN, or closed by us), read or not."""
        transport = self.request.transport
        return transport is None or transport.is_closing()

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
        """Send a text message (aiohttp raises ``ConnectionResetError`` on a closing connection)."""
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
        self._guard = HandshakeGuard(self.config.handshake_timeout_s, self.service.metrics)
        self.app = web.Application(middlewares=[self._guard.middleware])
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
        # keepalive_timeout: idle keep-alive connections close after it (and, from aiohttp 3.14.x, a connection
        # that never sends a request too); the HandshakeGuard covers the rest on every aiohttp version.
        self._runner = web.AppRunner(
            self.app,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=self.config.keepalive_timeout_s,
        )
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await self._site.start()
        self._guard.start(self._runner.server)
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
            heartbeat=self.config.heartbeat_s,
            protocols=(PROTOCOL_VERSION,),
            compress=False,
        )
        ws.too_big_message = f"a message exceeded {self.config.max_message_bytes} bytes; send audio in smaller frames (e.g. 20 ms)"
        await ws.prepare(request)
        await self.service.serve(
            AiohttpTransport(ws, request),
            origin=request.headers.get("Origin"),
            authorization=Secret.of(request.headers.get("Authorization")),
            remote=remote_of(request.remote),
            peer=request.remote or "?",
        )
        return ws

    async def _healthz(self, request: web.Request) -> web.Response:
        # Unauthenticated (load balancers): the status only; the cause is in the server log.
        if not self.service.alive:
            error = "the model failed to load" if self.service.load_error else "the ASR scheduler crashed"
            return web.json_response({"status": "failed", "error": error}, status=500)
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

    def _denied(self, request: web.Request) -> web.Response | None:
        denied = self.service.http_access(
            Secret.of(request.headers.get("Authorization")), request.remote or "?"
        )
        if denied is None:
            return None
        status, message = denied
        headers = {"WWW-Authenticate": 'Bearer realm="nemotron-asr"'} if status == 401 else {}
        return web.json_response({"error": message}, status=status, headers=headers)

    async def _metrics(self, request: web.Request) -> web.Response:
        denied = self._denied(request)
        if denied is not None:
            return denied
        return web.Response(
            body=self.service.metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE}
        )

    async def _info(self, request: web.Request) -> web.Response:
        denied = self._denied(request)
        if denied is not None:
            return denied
        return web.json_response(self.service.info())


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
