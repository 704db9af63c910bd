"""Ray Serve deployment of the ASR server: one replica per GPU, WebSocket ingress, sessions pinned to a replica.

Each replica loads one :class:`~pipecat_nemotron.engine.NemotronEngine` on its GPU and serves the same
``nemotron-asr.v1`` protocol as ``pipecat-nemotron serve`` (same session code, same limits, same close codes),
through Ray Serve's HTTP proxy and a Starlette WebSocket route. A WebSocket connection is one Serve request
for its whole lifetime, so the proxy routes it to one replica and every message of the session stays
there; ``max_ongoing_requests`` equals the replica's session capacity, so the router places new sessions
on replicas with free slots.

Example (a node with 4 GPUs)::

    import ray
    from ray import serve
    from pipecat_nemotron.engine import EngineConfig
    from pipecat_nemotron.server.config import ServerConfig
    from pipecat_nemotron.server.ray_serve import build_app

    ray.init()
    serve.start(http_options={"host": "0.0.0.0", "port": 8000})
    serve.run(
        build_app(EngineConfig(max_streams=128), ServerConfig(host="0.0.0.0", tokens=(token,)), num_replicas=4),
        route_prefix="/",
    )

Or with the Serve CLI: ``serve run pipecat_nemotron.server.ray_serve:app_builder model=... num_replicas=4``.
Requires ``pip install "pipecat-nemotron[ray]"``.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

from pipecat_nemotron.engine import EngineConfig
from pipecat_nemotron.server.config import ServerConfig, tokens_from
from pipecat_nemotron.server.metrics import METRICS_CONTENT_TYPE
from pipecat_nemotron.server.protocol import PROTOCOL_VERSION
from pipecat_nemotron.server.security import Secret
from pipecat_nemotron.server.service import ASRService
from pipecat_nemotron.server.transport import Incoming, remote_of

if TYPE_CHECKING:
    from ray.serve import Application
    from starlette.websockets import WebSocket

class StarletteTransport:
    """:class:`~pipecat_nemotron.server.transport.Transport` over a Starlette ``WebSocket`` (already accepted).

    Args:
        ws: The accepted WebSocket.
        max_message_bytes: Messages larger than this are reported as ``too_big`` (Serve's proxy has its own,
            larger, frame limit).

    """

    def __init__(self, ws: WebSocket, max_message_bytes: int) -> None:
        self.ws = ws
        self.max_message_bytes = max_message_bytes
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once closed (by either side)."""
        from starlette.websockets import WebSocketState

        return self._closed or self.ws.application_state != WebSocketState.CONNECTED

    def peer_gone(self) -> bool:
        """True once closed or disconnected.

        ASGI reports a client's disconnect only to a receive, so a paused session learns of it at its next read.
        """
        from starlette.websockets import WebSocketState

        return self.closed or self.ws.client_state == WebSocketState.DISCONNECTED

    async def receive(self, timeout: float | None) -> Incoming:
        """Next data message; ``TimeoutError`` after ``timeout`` seconds."""
        if self.closed:
            return Incoming("closed")
        try:
            message = await asyncio.wait_for(self.ws.receive(), timeout)
        except (asyncio.TimeoutError, TimeoutError):
            raise
        except Exception as e:  # noqa: BLE001 - a broken connection ends the session
            self._closed = True
            return Incoming("error", repr(e))
        if message["type"] == "websocket.disconnect":
            self._closed = True
            return Incoming("closed")
        data = message.get("bytes")
        if data is not None:
            if len(data) > self.max_message_bytes:
                return Incoming("too_big", f"{len(data)} bytes")
            return Incoming("binary", data)
        text = message.get("text") or ""
        if len(text.encode()) > self.max_message_bytes:
            return Incoming("too_big", f"{len(text)} characters")
        return Incoming("text", text)

    async def send_text(self, text: str) -> None:
        """Send a text message."""
        await self.ws.send_text(text)

    async def close(self, code: int, reason: str) -> None:
        """Close with ``code`` (idempotent)."""
        if self.closed:
            self._closed = True
            return
        self._closed = True
        await self.ws.close(code=code, reason=reason[:123])


def _replica_id() -> str:
    try:
        from ray import serve

        ctx = serve.get_replica_context()
        replica = getattr(ctx, "replica_id", None)
        return str(getattr(replica, "unique_id", None) or replica or ctx.replica_tag)
    except Exception:  # noqa: BLE001 - outside a replica (tests)
        return f"pid-{os.getpid()}"


def build_app(
    engine_config: EngineConfig,
    server_config: ServerConfig,
    *,
    num_replicas: int = 1,
    gpus_per_replica: float = 1.0,
    cpus_per_replica: float = 1.0,
    max_queued_requests: int = 1,
    name: str = "nemotron-asr",
) -> Application:
    """Build the Serve application (one engine per replica).

    Args:
        engine_config: Engine of every replica (``max_streams`` = sessions per replica; ``device="auto"`` uses
            the GPU Ray assigned to the replica).
        server_config: Limits and security (``host``/``port`` are ignored: Serve's proxy listens).
        num_replicas: Replicas (one per GPU).
        gpus_per_replica: GPUs Ray reserves per replica (0 for CPU-only tests).
        cpus_per_replica: CPUs Ray reserves per replica.
        max_queued_requests: Connections the router may hold while every replica is full (beyond that the
            proxy answers HTTP 503 and clients retry with backoff; -1: unlimited, connections wait for a slot).
        name: Deployment name.

    Returns:
        The application to pass to ``serve.run`` (with ``route_prefix="/"``).

    """
    from ray import serve

    max_sessions = min(server_config.max_sessions or engine_config.max_streams, engine_config.max_streams)

    @serve.deployment(
        name=name,
        num_replicas=num_replicas,
        ray_actor_options={"num_gpus": gpus_per_replica, "num_cpus": cpus_per_replica},
        max_ongoing_requests=max_sessions,  # one request per session: the router fills free slots
        max_queued_requests=max_queued_requests,
        health_check_period_s=10,
        health_check_timeout_s=30,
        graceful_shutdown_timeout_s=server_config.drain_timeout_s + 5,
        graceful_shutdown_wait_loop_s=2,
    )
    @serve.ingress()
    class NemotronASRDeployment:
        """One replica: one engine on one device; sessions are WebSockets on ``server_config.path``."""

        async def __init__(self, engine_config: EngineConfig, server_config: ServerConfig) -> None:
            # Imported here: this class is pickled by value, and the driver's logger sinks may not pickle.
            from loguru import logger

            self.service = ASRService(server_config, engine_config, server_id=_replica_id())
            await self.service.start()
            logger.info(f"Nemotron ASR replica {self.service.server_id} ready ({max_sessions} sessions)")

        def __serve_build_asgi_app__(self) -> Any:
            # Built on the replica (an app object built on the driver would have to be pickled).
            return starlette_app(self.service)

        async def check_health(self) -> None:
            """Ray Serve's replica health check: fail (and get replaced) if the engine's scheduler died."""
            if not self.service.alive:
                raise RuntimeError(f"ASR engine failed: {self.service.load_error or 'scheduler crashed'}")

        async def __del__(self) -> None:
            await self.service.stop(drain_timeout_s=0)

    return NemotronASRDeployment.bind(engine_config, server_config)


def starlette_app(service: ASRService) -> Any:
    """A Starlette ASGI app serving ``service``: the session WebSocket and the HTTP endpoints."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route, WebSocketRoute

    async def session(ws: WebSocket) -> None:
        requested = ws.scope.get("subprotocols") or []
        await ws.accept(subprotocol=PROTOCOL_VERSION if PROTOCOL_VERSION in requested else None)
        await service.serve(
            StarletteTransport(ws, service.config.max_message_bytes),
            origin=ws.headers.get("origin"),
            authorization=Secret.of(ws.headers.get("authorization")),
            remote=remote_of(tuple(ws.client) if ws.client else None),
            peer=ws.client.host if ws.client else "?",
        )

    async def healthz(request: Request) -> JSONResponse:
        ok = service.alive
        return JSONResponse({"status": "ok" if ok else "failed"}, status_code=200 if ok else 500)

    async def readyz(request: Request) -> JSONResponse:
        ok = service.ready and service.alive
        return JSONResponse({"status": "ready" if ok else "not_ready"}, status_code=200 if ok else 503)

    def denied(request: Request) -> JSONResponse | None:
        refusal = service.http_access(
            Secret.of(request.headers.get("authorization")), request.client.host if request.client else "?"
        )
        if refusal is None:
            return None
        return JSONResponse({"error": refusal[1]}, status_code=refusal[0])

    async def metrics(request: Request) -> Response:
        return denied(request) or Response(service.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    async def info(request: Request) -> JSONResponse:
        return denied(request) or JSONResponse(service.info())

    return Starlette(
        routes=[
            WebSocketRoute(service.config.path, session),
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
            Route("/v1/info", info),
        ]
    )


def app_builder(args: dict[str, Any]) -> Application:
    """Entry point for ``serve run pipecat_nemotron.server.ray_serve:app_builder key=value ...``.

    Keys: ``model``, ``device`` (default auto), ``max_sessions`` (default 64), ``num_replicas`` (default 1),
    ``gpus_per_replica`` (default 1), ``insecure`` (loopback only). Tokens come from ``NEMOTRON_ASR_TOKENS``, the
    ``/metrics`` token (optional) from ``NEMOTRON_ASR_METRICS_TOKEN``.
    """
    max_sessions = int(args.get("max_sessions", 64))
    engine_config = EngineConfig(
        model=str(args.get("model", EngineConfig().model)),
        device=str(args.get("device", "auto")),
        max_streams=max_sessions,
        max_batch_size=int(args.get("max_batch_size", max_sessions)),
    )
    insecure = str(args.get("insecure", "false")).lower() in ("1", "true", "yes")
    server_config = ServerConfig(
        host="127.0.0.1" if insecure else "0.0.0.0",
        tokens=tokens_from([os.environ.get("NEMOTRON_ASR_TOKENS", "")]),
        metrics_token=os.environ.get("NEMOTRON_ASR_METRICS_TOKEN") or None,
        insecure=insecure,
        max_sessions=max_sessions,
    )
    return build_app(
        engine_config,
        server_config,
        num_replicas=int(args.get("num_replicas", 1)),
        gpus_per_replica=float(args.get("gpus_per_replica", 1.0)),
    )
