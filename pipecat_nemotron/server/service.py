"""The framework-independent core of the ASR server: :class:`ASRService`.

One engine and its sessions: engine lifecycle (load, warm-up, drain), admission control (origin, token,
readiness, capacity), authentication (header or config token, the failed-authentication lockout, the
pending-authentication pool), limits and metrics. The aiohttp server (:mod:`pipecat_nemotron.server.app`)
and the Ray Serve deployment (:mod:`pipecat_nemotron.server.ray_serve`) hand it their accepted
connections as a :class:`~pipecat_nemotron.server.transport.Transport`.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from loguru import logger

from pipecat_nemotron.asr import EngineConfig, NemotronEngine
from pipecat_nemotron.server.config import ServerConfig, metrics_tokens_for, throttle_for
from pipecat_nemotron.server.context import SessionContext
from pipecat_nemotron.server.engine_load import EngineLoad
from pipecat_nemotron.server.metrics import ServerMetrics
from pipecat_nemotron.server.protocol import (
    AUTH_BACKOFF_REASON,
    PROTOCOL_VERSION,
    CloseCode,
    ErrorMessage,
    close_reason,
    dump_server_message,
)
from pipecat_nemotron.server.security import (
    HttpAccess,
    PendingAuth,
    Secret,
    TokenSet,
    log_safe,
    peer_key,
    round_up,
)
from pipecat_nemotron.server.session import Session
from pipecat_nemotron.server.transport import Transport


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
        #: How busy the engine is (sessions that are behind read faster than real time while it has room).
        self.load = EngineLoad()
        self.sessions: dict[str, Session] = {}
        self.ready = False
        self.draining = False
        self.load_error: BaseException | None = None
        # Only digests of the tokens are kept (TokenSet): nothing here can print a token.
        self._tokens = TokenSet(config.tokens)
        self._throttle = throttle_for(config)
        self._http = HttpAccess(metrics_tokens_for(config, self._tokens), self._throttle, self._auth_failed)
        self._idle = asyncio.Event()
        self._idle.set()
        self._pending: PendingAuth[Session] = PendingAuth(self.max_pending_auth)
        self._tasks: set[asyncio.Task[None]] = set()
        self.metrics.set_backlog_source(
            lambda: max((s.backlog_ms for s in self.sessions.values()), default=0.0) / 1000
        )
        self.metrics.set_stream_source(lambda: float(self.engine.open_streams))
        self.metrics.capacity.set(self.max_sessions)
        #: What each session may use of this service (sessions hold it, not the service).
        self.context = SessionContext(
            config=config,
            engine=self.engine,
            metrics=self.metrics,
            load=self.load,
            server_id=self.server_id,
            model_name=lambda: self.model_name,
            check_token=self.check_token,
            slot_freed=self.engine_slot_freed,
        )

    @property
    def model_name(self) -> str:
        """The served model's name for clients (``ready.model``): a hub id as given, a local file's name only.

        A client learns which model it talks to, never where the server keeps it (an absolute install path names
        users and directories of the host).
        """
        model = self.engine.config.model
        if model.endswith(".nemo") or os.path.isabs(model) or model.startswith(("~", ".")) or Path(model).exists():
            return Path(model).name or model
        return model

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
        return self.load_error is None and self.engine.error is None

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
        self.engine.add_step_listener(self.load.observe_step)
        info = self.engine.info
        self.metrics.info.info(
            {
                "model": info.model,
                "device": info.device,
                "dtype": info.dtype,
                "protocol": PROTOCOL_VERSION,
                "latency_modes": ",".join(str(m) for m in info.latency_modes),
                "languages": ",".join(info.languages),  # empty on an English-only model
            }
        )
        self.metrics.capacity.set(self.max_sessions)
        self.ready = True
        self.metrics.ready.set(1)
        logger.info(f"ASR service ready: {self.max_sessions} session slots, protocol {PROTOCOL_VERSION}")

    async def stop(self, drain_timeout_s: float | None = None, stop_engine: bool = True) -> None:
        """Stop accepting sessions, let running ones finish (up to the drain timeout), close the rest with 1001.

        Args:
            drain_timeout_s: Override of ``config.drain_timeout_s``, s.
            stop_engine: Stop the engine afterwards if this service created it (False: the caller does, with
                :meth:`stop_engine`, once the engine's other users, the Riva gRPC calls, have ended).

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
        if stop_engine:
            await self.stop_engine()

    async def stop_engine(self) -> None:
        """Stop the engine if this service created it (idempotent)."""
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
        """Whether a ``/metrics`` or ``/v1/info`` request may be answered (see :meth:`HttpAccess.check`)."""
        return self._http.check(authorization, peer)

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
        session = Session(self.context, transport, uuid.uuid4().hex[:12], token_checked=token_checked, remote=remote)
        if not token_checked and not await self._authenticate_in_config(session, key, origin):
            return
        await self._run_admitted(session)

    async def _authenticate_in_config(self, session: Session, key: str, origin: str | None) -> bool:
        """Wait for the config (and its token) of a connection without an ``Authorization`` header.

        Until then the connection holds no session slot (anonymous connections cannot crowd out authenticated
        ones), and at most ``max_pending_auth`` of them wait at once; a newcomer evicts from the peer holding
        the most.

        Returns:
            True if the session authenticated and is still admissible; False if it was refused, evicted or
            went away (its connection is then already closed).

        """
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
            return False
        if session.close_code is not None:  # evicted while its config was arriving
            return False
        self._throttle.succeeded(key)
        refusal = self.admission(origin, None)
        if refusal is not None:
            await self.refuse(session.transport, refusal[0], refusal[1])
            return False
        return True

    async def _run_admitted(self, session: Session) -> None:
        """Register an admitted session, run it to its end, then release it."""
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
                model=info.model,
                device=info.device,
                dtype=info.dtype,
                latency_modes=list(info.latency_modes),
                languages=list(info.languages),
            )
        return data
