"""Prometheus metrics of the ASR server, on a registry of its own (never the process-global default one).

Every name starts with ``nemotron_asr_``; durations are in seconds (Prometheus convention) even where the
protocol reports milliseconds. Scrape ``GET /metrics``.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from pipecat_nemotron.asr import StepStats

#: ``Content-Type`` of the text exposition format.
METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST

#: Start of every metric name.
_PREFIX = "nemotron_asr_"

_BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
_STEP_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
_FINALIZE_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)


class ServerMetrics:
    """The server's metrics and the hooks that update them.

    Every metric is an attribute named as below; its Prometheus name is ``nemotron_asr_`` plus the name given
    here, its help text the one given here.

    Args:
        registry: Registry to register on (default: a new one, so several servers can live in one process).

    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.info = Info(_PREFIX + "server", "Model, device and protocol of this server.", registry=self.registry)
        self._declare_sessions()
        self._declare_traffic()
        self._declare_steps()

    def _declare_sessions(self) -> None:
        """Readiness, capacity and the life of sessions."""
        self.ready = self._gauge("ready", "1 once the model is loaded and warm, 0 otherwise.")
        self.capacity = self._gauge("capacity_sessions", "Session slots of this server.")
        self.active_sessions = self._gauge(
            "active_sessions", "Sessions connected now (admitted, holding a slot)."
        )
        self.engine_streams = self._gauge("engine_open_streams", "Engine streams holding a cache slot now.")
        self.grpc_streams = self._gauge(
            "grpc_streams", "Riva gRPC StreamingRecognize calls open now (they hold engine slots too)."
        )
        self.sessions = self._counter("sessions", "Sessions admitted.")
        self.refused = self._counter(
            "sessions_refused",
            "Connections refused before a session opened, by reason "
            "(capacity, unauthorized, forbidden_origin, not_ready, auth_backoff: the peer is locked out after "
            "failed authentications, pending_evicted: evicted while waiting to authenticate; Riva gRPC calls: "
            "grpc_<status>, e.g. grpc_unauthenticated, grpc_invalid_argument).",
            "reason",
        )
        self.dropped = self._counter(
            "sessions_dropped",
            "Sessions the server closed with an error code, by reason "
            "(idle_timeout, message_too_big, protocol_error, backlog, internal, going_away, ...).",
            "reason",
        )
        self.ended = self._counter(
            "sessions_ended",
            "Sessions ended, by how (client_close: close message, disconnect: the client went away, "
            "dropped: the server closed it).",
            "how",
        )

    def _declare_traffic(self) -> None:
        """Audio in, audio lost, and connections cut or paused."""
        self.audio_seconds = self._counter("audio_received_seconds", "Audio received from clients, seconds.")
        self.audio_dropped_seconds = self._counter(
            "audio_dropped_seconds",
            "Audio received but never decoded because its session ended first (client gone, error), seconds.",
        )
        self.handshake_timeouts = self._counter(
            "handshake_timeouts",
            "TCP connections closed for not completing an HTTP request within the handshake timeout.",
        )
        self.throttled_seconds = self._counter(
            "throttled_seconds",
            "Time sessions' reads were paused for sending audio ahead of real time, control messages above "
            "their rate, or for engine backlog, seconds.",
        )
        self.caught_up_seconds = self._counter(
            "caught_up_seconds",
            "Audio read from sessions that were ahead of real time faster than real time (up to max_speed, while "
            "the engine had spare capacity), seconds of audio.",
        )

    def _declare_steps(self) -> None:
        """The engine's batched model steps and what sessions wait for."""
        self.steps = self._counter("steps", "Batched model steps run.")
        self.batch_size = self._histogram("batch_size", "Stream chunks per model step.", _BATCH_BUCKETS)
        self.step_seconds = self._histogram(
            "step_seconds", "Wall time of one batched model step, seconds.", _STEP_BUCKETS
        )
        self.queue_wait_seconds = self._histogram(
            "queue_wait_seconds",
            "Longest time a chunk of a step waited for that step, seconds (one sample per step).",
            _WAIT_BUCKETS,
        )
        self.partial_lag_seconds = self._histogram(
            "partial_lag_seconds",
            "From a chunk's last needed sample arriving to its partial result, seconds.",
            _WAIT_BUCKETS,
        )
        self.finalize_seconds = self._histogram(
            "finalize_seconds",
            "Time-to-final: from the finalize message to the final text, seconds.",
            _FINALIZE_BUCKETS,
        )
        self.max_backlog = self._gauge(
            "max_session_backlog_seconds",
            "Largest audio backlog (received, not yet decoded) of any session, seconds.",
        )

    def _gauge(self, name: str, documentation: str) -> Gauge:
        return Gauge(_PREFIX + name, documentation, registry=self.registry)

    def _counter(self, name: str, documentation: str, *labels: str) -> Counter:
        return Counter(_PREFIX + name, documentation, labels, registry=self.registry)

    def _histogram(self, name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(_PREFIX + name, documentation, buckets=buckets, registry=self.registry)

    def set_backlog_source(self, source: Callable[[], float]) -> None:
        """Compute ``nemotron_asr_max_session_backlog_seconds`` at scrape time from ``source`` (seconds)."""
        self.max_backlog.set_function(source)

    def set_stream_source(self, source: Callable[[], float]) -> None:
        """Compute ``nemotron_asr_engine_open_streams`` at scrape time from ``source``."""
        self.engine_streams.set_function(source)

    def observe_step(self, stats: StepStats) -> None:
        """Engine step listener: batch size, step time and queue wait of one step (cheap; runs on the loop)."""
        self.steps.inc()
        self.batch_size.observe(stats.batch_size)
        self.step_seconds.observe(stats.step_ms / 1000.0)
        self.queue_wait_seconds.observe(stats.queue_ms_max / 1000.0)

    def render(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)
