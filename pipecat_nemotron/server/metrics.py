"""Prometheus metrics of the ASR server, on a registry of its own (never the process-global default one).

Every name starts with ``nemotron_asr_``; durations are in seconds (Prometheus convention) even where the
protocol reports milliseconds. Scrape ``GET /metrics``.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from pipecat_nemotron.engine import StepStats

#: ``Content-Type`` of the text exposition format.
METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST

_BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
_STEP_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
_FINALIZE_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)


class ServerMetrics:
    """The server's metrics and the hooks that update them.

    Args:
        registry: Registry to register on (default: a new one, so several servers can live in one process).

    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.info = Info("nemotron_asr_server", "Model, device and protocol of this server.", registry=r)
        self.ready = Gauge(
            "nemotron_asr_ready", "1 once the model is loaded and warm, 0 otherwise.", registry=r
        )
        self.capacity = Gauge("nemotron_asr_capacity_sessions", "Session slots of this server.", registry=r)
        self.active_sessions = Gauge(
            "nemotron_asr_active_sessions", "Sessions connected now (admitted, holding a slot).", registry=r
        )
        self.engine_streams = Gauge(
            "nemotron_asr_engine_open_streams", "Engine streams holding a cache slot now.", registry=r
        )
        self.sessions = Counter("nemotron_asr_sessions", "Sessions admitted.", registry=r)
        self.refused = Counter(
            "nemotron_asr_sessions_refused",
            "Connections refused before a session opened, by reason "
            "(capacity, unauthorized, forbidden_origin, not_ready, auth_backoff: the peer is locked out after "
            "failed authentications, pending_evicted: evicted while waiting to authenticate).",
            ["reason"],
            registry=r,
        )
        self.dropped = Counter(
            "nemotron_asr_sessions_dropped",
            "Sessions the server closed with an error code, by reason "
            "(idle_timeout, message_too_big, protocol_error, backlog, internal, going_away, ...).",
            ["reason"],
            registry=r,
        )
        self.ended = Counter(
            "nemotron_asr_sessions_ended",
            "Sessions ended, by how (client_close: close message, disconnect: the client went away, "
            "dropped: the server closed it).",
            ["how"],
            registry=r,
        )
        self.audio_seconds = Counter(
            "nemotron_asr_audio_received_seconds", "Audio received from clients, seconds.", registry=r
        )
        self.audio_dropped_seconds = Counter(
            "nemotron_asr_audio_dropped_seconds",
            "Audio received but never decoded because its session ended first (client gone, error), seconds.",
            registry=r,
        )
        self.handshake_timeouts = Counter(
            "nemotron_asr_handshake_timeouts",
            "TCP connections closed for not completing an HTTP request within the handshake timeout.",
            registry=r,
        )
        self.throttled_seconds = Counter(
            "nemotron_asr_throttled_seconds",
            "Time sessions' reads were paused for sending audio ahead of real time, control messages above "
            "their rate, or for engine backlog, seconds.",
            registry=r,
        )
        self.steps = Counter("nemotron_asr_steps", "Batched model steps run.", registry=r)
        self.batch_size = Histogram(
            "nemotron_asr_batch_size", "Stream chunks per model step.", buckets=_BATCH_BUCKETS, registry=r
        )
        self.step_seconds = Histogram(
            "nemotron_asr_step_seconds",
            "Wall time of one batched model step, seconds.",
            buckets=_STEP_BUCKETS,
            registry=r,
        )
        self.queue_wait_seconds = Histogram(
            "nemotron_asr_queue_wait_seconds",
            "Longest time a chunk of a step waited for that step, seconds (one sample per step).",
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self.partial_lag_seconds = Histogram(
            "nemotron_asr_partial_lag_seconds",
            "From a chunk's last needed sample arriving to its partial result, seconds.",
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self.finalize_seconds = Histogram(
            "nemotron_asr_finalize_seconds",
            "Time-to-final: from the finalize message to the final text, seconds.",
            buckets=_FINALIZE_BUCKETS,
            registry=r,
        )
        self.max_backlog = Gauge(
            "nemotron_asr_max_session_backlog_seconds",
            "Largest audio backlog (received, not yet decoded) of any session, seconds.",
            registry=r,
        )

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
