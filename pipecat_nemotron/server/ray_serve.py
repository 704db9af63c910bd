"""Ray Serve deployment of the ASR server: one replica per GPU, WebSocket ingress, sessions pinned to a replica.

Each replica loads one :class:`~pipecat_nemotron.asr.NemotronEngine` on its GPU and serves the same
``nemotron-asr.v1`` protocol as ``pipecat-nemotron serve`` (same session code, same limits, same close codes),
through Ray Serve's HTTP proxy and a Starlette WebSocket route. A WebSocket connection is one Serve request
for its whole lifetime, so the proxy routes it to one replica and every message of the session stays
there; ``max_ongoing_requests`` equals the replica's session capacity, so the router places new sessions
on replicas with free slots.

Example (a node with 4 GPUs)::

    import ray
    from ray import serve
    from pipecat_nemotron.asr import EngineConfig
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
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pipecat_nemotron.asr import EngineConfig
from pipecat_nemotron.server._ray_private import serve_shutdown_probe
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

    A reader task moves the connection's messages into an inbox as they arrive, so that a session whose reads
    are paused (pacing, backlog) still learns at once that its client is gone: under Serve the client's
    connection ends at the proxy, and the replica hears of it (a disconnect, or an error once the proxy has
    died) only through a receive. The inbox holds no more than Serve's own receive queue would (Serve fetches
    every message from the proxy whether or not the app reads).

    Args:
        ws: The accepted WebSocket.
        max_message_bytes: Messages larger than this are reported as ``too_big`` (Serve's proxy has its own,
            larger, frame limit).

    """

    def __init__(self, ws: WebSocket, max_message_bytes: int) -> None:
        self.ws = ws
        self.max_message_bytes = max_message_bytes
        self._closed = False
        self._gone = False
        self._inbox: asyncio.Queue[Incoming] = asyncio.Queue()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @property
    def closed(self) -> bool:
        """True once closed (by either side)."""
        from starlette.websockets import WebSocketState

        return self._closed or self.ws.application_state != WebSocketState.CONNECTED

    def peer_gone(self) -> bool:
        """True once closed, or once the reader saw the client's disconnect or a broken connection."""
        from starlette.websockets import WebSocketState

        return self.closed or self._gone or self.ws.client_state == WebSocketState.DISCONNECTED

    async def _read(self) -> None:
        while True:
            incoming = await self._receive_one()
            if incoming.kind in ("closed", "error"):
                self._gone = True
            self._inbox.put_nowait(incoming)
            if self._gone:
                return

    async def _receive_one(self) -> Incoming:
        try:
            message = await self.ws.receive()
        except Exception as e:  # noqa: BLE001 - a broken connection (e.g. a dead proxy) ends the session
            return Incoming("error", repr(e))
        if message["type"] == "websocket.disconnect":
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

    async def receive(self, timeout: float | None) -> Incoming:
        """Next data message; ``TimeoutError`` after ``timeout`` seconds."""
        if self._closed or (self._gone and self._inbox.empty()):
            return Incoming("closed")
        incoming = await asyncio.wait_for(self._inbox.get(), timeout)
        if incoming.kind in ("closed", "error"):
            self._closed = True
        return incoming

    def stop_reading(self) -> None:
        """Stop the reader task (the session is over)."""
        self._reader.cancel()

    async def send_text(self, text: str) -> None:
        """Send a text message."""
        await self.ws.send_text(text)

    async def close(self, code: int, reason: str) -> None:
        """Close with ``code`` (idempotent)."""
        self.stop_reading()
        if self.closed:
            self._closed = True
            return
        self._closed = True
        await self.ws.close(code=code, reason=reason[:123])


def replica_id() -> str:
    """The id of this Serve replica (outside a replica: ``pid-<process id>``)."""
    try:
        from ray import serve

        ctx = serve.get_replica_context()
        replica = getattr(ctx, "replica_id", None)
        return str(getattr(replica, "unique_id", None) or replica or ctx.replica_tag)
    except Exception:  # noqa: BLE001 - outside a replica (tests)
        return f"pid-{os.getpid()}"


async def drain_watcher(
    drain: Callable[[], Awaitable[None]], probe: Callable[[], bool], what: Callable[[], str], period_s: float = 0.25
) -> None:
    """Run ``drain`` once ``probe`` says Serve is shutting the replica down (ASR and TTS replicas alike).

    ASR: new sessions get 4503; running ones get ``drain_timeout_s`` to end, then the ``going_away`` error and
    1001. TTS: calls already running finish their replies for up to ``drain_timeout_s``. Both inside Serve's
    ``graceful_shutdown_timeout_s`` (``DRAIN_MARGIN_S`` above the drain).

    Args:
        drain: Drains the replica's server and stops its engine.
        probe: Serve's shutdown flag (:func:`~pipecat_nemotron.server._ray_private.serve_shutdown_probe`).
        what: What is being drained, for the log line (read when the drain starts).
        period_s: How often the flag is read, s.

    """
    while not probe():  # noqa: ASYNC110 - Serve sets the flag on its own loop: nothing to await here
        await asyncio.sleep(period_s)
    from loguru import logger

    logger.info(f"Serve is shutting {what()} down: draining")
    await drain()


#: ``drain_timeout_s`` of a replica started by :func:`app_builder`, s (``ServerConfig``'s default).
DEFAULT_DRAIN_TIMEOUT_S = 30.0

#: Serve's ``graceful_shutdown_timeout_s`` exceeds the server's ``drain_timeout_s`` by this much, s: detecting
#: the shutdown (0.25 s), closing the sessions (up to 5 s) and Serve's wait loop (1 s).
DRAIN_MARGIN_S = 10.0


def cluster_gpus() -> float | None:
    """GPUs of the Ray cluster this process is connected to; without a connection, of this machine (None: unknown)."""
    try:
        import ray

        if ray.is_initialized():
            return float(ray.cluster_resources().get("GPU", 0.0))
        import torch

        return float(torch.cuda.device_count())
    except Exception:  # noqa: BLE001 - unknown: let Ray decide
        return None


def resolve_gpus_per_replica(gpus_per_replica: float | None, device: str) -> float:
    """GPUs per replica: as given, or (None) 1 where the cluster has a GPU.

    Raises:
        ValueError: None was given, the device is not the CPU, and the cluster has no GPU: a replica asking for a
            GPU would wait for ever (Ray logs only ``No available node types can fulfill resource request``).

    """
    if gpus_per_replica is not None:
        if gpus_per_replica < 0:
            raise ValueError(f"gpus_per_replica must be >= 0, got {gpus_per_replica}")
        if gpus_per_replica > 0 and cluster_gpus() == 0:
            from loguru import logger

            logger.warning(
                f"gpus_per_replica={gpus_per_replica:g} but the Ray cluster has no GPU: the replicas wait for a GPU "
                "node (autoscaling); pass gpus_per_replica=0 (device='cpu') to serve on CPU"
            )
        return gpus_per_replica
    if device == "cpu":
        return 0.0
    gpus = cluster_gpus()
    if gpus is None or gpus > 0:
        return 1.0
    raise ValueError(
        "no GPU in the Ray cluster (or on this machine, before Ray starts), so a replica asking for one would "
        "wait for ever: pass gpus_per_replica=0 "
        "(and device='cpu') to serve on CPU, or gpus_per_replica=1 to wait for an autoscaled GPU node"
    )


def build_app(
    engine_config: EngineConfig,
    server_config: ServerConfig,
    *,
    num_replicas: int = 1,
    gpus_per_replica: float | None = None,
    cpus_per_replica: float = 1.0,
    cpu_threads: int | None = None,
    max_queued_requests: int | None = None,
    name: str = "nemotron-asr",
) -> Application:
    """Build the Serve application (one engine per replica).

    Args:
        engine_config: Engine of every replica (``max_streams`` = sessions per replica; ``device="auto"`` uses
            the GPU Ray assigned to the replica, or the CPU).
        server_config: Limits and security (``host``/``port`` are ignored: Serve's proxy listens);
            ``drain_timeout_s`` is the drain on redeploy and downscale.
        num_replicas: Replicas (one per GPU).
        gpus_per_replica: GPUs Ray reserves per replica; None: 1 where the cluster has a GPU, 0 for
            ``device="cpu"``, else a ``ValueError`` naming the fix (0 for CPU serving).
        cpus_per_replica: CPUs Ray reserves per replica.
        cpu_threads: torch intra-op threads (and ``OMP_NUM_THREADS``) of each replica; None: ``cpus_per_replica``
            rounded down, at least 1 (oversubscribed OpenMP threads made CPU steps ~10x slower).
        max_queued_requests: Connections Serve's router may hold while it places them; None: the deployment's
            session capacity, so a burst of bots starting together is admitted (beyond it: HTTP 500, see
            docs/DEPLOYMENT.md); -1: unlimited.
        name: Deployment name.

    Returns:
        The application to pass to ``serve.run`` (with ``route_prefix="/"``).

    Raises:
        ValueError: No GPU in the cluster and ``gpus_per_replica`` not given, or a value out of range.

    """
    from ray import serve

    threads, max_sessions, options = deployment_options(
        engine_config,
        server_config,
        num_replicas=num_replicas,
        gpus_per_replica=gpus_per_replica,
        cpus_per_replica=cpus_per_replica,
        cpu_threads=cpu_threads,
        max_queued_requests=max_queued_requests,
    )

    @serve.deployment(name=name, **options)
    @serve.ingress()
    class NemotronASRDeployment:
        """One replica: one engine on one device; sessions are WebSockets on ``server_config.path``."""

        async def __init__(self, engine_config: EngineConfig, server_config: ServerConfig) -> None:
            # Imported here: this class is pickled by value, and the driver's logger sinks may not pickle.
            import torch
            from loguru import logger

            torch.set_num_threads(threads)
            self.service = ASRService(server_config, engine_config, server_id=replica_id())
            await self.service.start()
            self._drain = start_drain_watcher(
                self.service.stop,
                lambda: f"ASR replica {self.service.server_id} (its {len(self.service.sessions)} session(s))",
            )
            logger.info(
                f"Nemotron ASR replica {self.service.server_id} ready ({max_sessions} sessions, "
                f"{threads} CPU thread(s))"
            )

        def __serve_build_asgi_app__(self) -> Any:
            # Built on the replica (an app object built on the driver would have to be pickled).
            return starlette_app(self.service)

        async def check_health(self) -> None:
            """Ray Serve's replica health check: fail (and get replaced) if the engine's scheduler died."""
            if not self.service.alive:
                raise RuntimeError(f"ASR engine failed: {self.service.load_error or 'scheduler crashed'}")

        async def __del__(self) -> None:
            await stop_replica(self._drain, self.service.draining, lambda: self.service.stop(drain_timeout_s=0))

    return NemotronASRDeployment.bind(engine_config, server_config)


def deployment_options(
    engine_config: EngineConfig,
    server_config: ServerConfig,
    *,
    num_replicas: int,
    gpus_per_replica: float | None,
    cpus_per_replica: float,
    cpu_threads: int | None,
    max_queued_requests: int | None,
) -> tuple[int, int, dict[str, Any]]:
    """The ASR replica's torch threads, its session capacity, and ``serve.deployment``'s options (see :func:`build_app`).

    Raises:
        ValueError: No GPU in the cluster and ``gpus_per_replica`` not given, or ``cpu_threads`` below 1.

    """
    gpus = resolve_gpus_per_replica(gpus_per_replica, engine_config.device)
    threads = replica_threads(cpu_threads, cpus_per_replica)
    max_sessions = min(server_config.max_sessions or engine_config.max_streams, engine_config.max_streams)
    # Each replica admits or refuses for itself (4013 when full, 4503 while draining): Serve's per-replica cap
    # only needs room for them plus the connections still authenticating or being refused.
    headroom = server_config.max_pending_auth or max(16, max_sessions)
    options = replica_options(
        num_replicas=num_replicas,
        gpus=gpus,
        cpus=cpus_per_replica,
        threads=threads,
        max_ongoing=max_sessions + headroom,
        max_queued=max_queued_requests if max_queued_requests is not None else num_replicas * max_sessions,
        drain_timeout_s=server_config.drain_timeout_s,
    )
    return threads, max_sessions, options


def replica_threads(cpu_threads: int | None, cpus_per_replica: float) -> int:
    """Intra-op torch threads of a replica: as given, or ``cpus_per_replica`` rounded down, at least 1.

    Raises:
        ValueError: ``cpu_threads`` below 1.

    """
    threads = cpu_threads if cpu_threads is not None else max(1, int(cpus_per_replica))
    if threads < 1:
        raise ValueError(f"cpu_threads must be >= 1, got {threads}")
    return threads


def replica_options(
    *,
    num_replicas: int,
    gpus: float,
    cpus: float,
    threads: int,
    max_ongoing: int,
    max_queued: int,
    drain_timeout_s: float,
) -> dict[str, Any]:
    """``serve.deployment``'s options for a model replica (ASR or TTS): resources, admission and drain.

    Args:
        num_replicas: Replicas (one per GPU).
        gpus: GPUs Ray reserves per replica.
        cpus: CPUs Ray reserves per replica.
        threads: ``OMP_NUM_THREADS`` of the replica's process.
        max_ongoing: Requests Serve routes to one replica at once; the router holds the rest.
        max_queued: Requests the router holds while every replica is at ``max_ongoing`` (-1: unlimited); beyond
            it Serve refuses (backpressure).
        drain_timeout_s: The replica's drain, s; Serve's ``graceful_shutdown_timeout_s`` is ``DRAIN_MARGIN_S``
            longer, so the drain ends before Serve would kill the replica.

    """
    return {
        "num_replicas": num_replicas,
        "ray_actor_options": {
            "num_gpus": gpus,
            "num_cpus": cpus,
            "runtime_env": {"env_vars": {"OMP_NUM_THREADS": str(threads)}},
        },
        "max_ongoing_requests": max_ongoing,
        "max_queued_requests": max_queued,
        "health_check_period_s": 10,
        "health_check_timeout_s": 30,
        "graceful_shutdown_timeout_s": drain_timeout_s + DRAIN_MARGIN_S,
        "graceful_shutdown_wait_loop_s": 1,
    }


def start_drain_watcher(drain: Callable[[], Awaitable[None]], what: Callable[[], str]) -> asyncio.Task[None] | None:
    """Watch Serve's shutdown flag and run ``drain`` when it rises (None, with a warning, without the flag)."""
    from loguru import logger

    probe = serve_shutdown_probe()
    if probe is None:
        logger.warning(
            "this Ray version has no replica shutdown flag: on redeploy or downscale, sessions and calls get no "
            "drain, only a lost connection when Serve's graceful_shutdown_timeout_s ends"
        )
        return None
    return asyncio.get_running_loop().create_task(drain_watcher(drain, probe, what))


async def stop_replica(
    drain: asyncio.Task[None] | None, draining: bool, stop_now: Callable[[], Awaitable[None]]
) -> None:
    """Serve is stopping the replica: let a drain that began finish (it stops the engine), else ``stop_now``.

    Args:
        drain: The replica's drain watcher (None: none runs).
        draining: Whether the replica's server has begun draining.
        stop_now: Stops the server and its engine at once.

    """
    if drain is not None and (drain.done() or draining):
        await drain  # drained, or draining with its sessions gone: it ends with the engine stopped
        return
    if drain is not None:
        drain.cancel()
    await stop_now()


def starlette_app(service: ASRService) -> Any:
    """A Starlette ASGI app serving ``service``: the session WebSocket and the HTTP endpoints."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route, WebSocketRoute

    async def session(ws: WebSocket) -> None:
        requested = ws.scope.get("subprotocols") or []
        await ws.accept(subprotocol=PROTOCOL_VERSION if PROTOCOL_VERSION in requested else None)
        transport = StarletteTransport(ws, service.config.max_message_bytes)
        try:
            await service.serve(
                transport,
                origin=ws.headers.get("origin"),
                authorization=Secret.of(ws.headers.get("authorization")),
                remote=remote_of(tuple(ws.client) if ws.client else None),
                peer=ws.client.host if ws.client else "?",
            )
        finally:
            transport.stop_reading()

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
    ``gpus_per_replica`` (default: 1 where the cluster has a GPU; 0 for CPU), ``cpus_per_replica`` (default 1),
    ``cpu_threads`` (default: ``cpus_per_replica``), ``max_queued_requests`` (default: the sessions of all
    replicas), ``drain_timeout_s`` (default 30), ``insecure`` (loopback only). Tokens come from
    ``NEMOTRON_ASR_TOKENS``, the ``/metrics`` token (optional) from ``NEMOTRON_ASR_METRICS_TOKEN``.
    """
    known = {
        "model", "device", "max_sessions", "max_batch_size", "num_replicas", "gpus_per_replica",
        "cpus_per_replica", "cpu_threads", "max_queued_requests", "drain_timeout_s", "insecure",
    }  # fmt: skip
    unknown = sorted(set(args) - known)
    if unknown:
        raise ValueError(f"unknown app_builder argument(s) {unknown}; known: {sorted(known)}")
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
        drain_timeout_s=float(args.get("drain_timeout_s", DEFAULT_DRAIN_TIMEOUT_S)),
    )

    return build_app(engine_config, server_config, **deployment_args(args))


def deployment_args(args: dict[str, Any]) -> dict[str, Any]:
    """The replica arguments of an application builder, from a config file's (string) ``args``.

    Returns:
        ``num_replicas``, ``gpus_per_replica``, ``cpus_per_replica``, ``cpu_threads`` and ``max_queued_requests``
        (None where unset: the builder's default).

    """

    def number(key: str, kind: type) -> Any:
        return kind(args[key]) if key in args else None

    return {
        "num_replicas": int(args.get("num_replicas", 1)),
        "gpus_per_replica": number("gpus_per_replica", float),
        "cpus_per_replica": float(args.get("cpus_per_replica", 1.0)),
        "cpu_threads": number("cpu_threads", int),
        "max_queued_requests": number("max_queued_requests", int),
    }
