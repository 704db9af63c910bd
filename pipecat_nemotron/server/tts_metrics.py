"""Prometheus metrics of the server's Magpie TTS (:class:`TTSMetrics`), on the server's registry.

Every name starts with ``nemotron_tts_``; durations in seconds. They render on the same ``GET /metrics`` as the
ASR metrics (:mod:`~pipecat_nemotron.server.metrics`).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_PREFIX = "nemotron_tts_"

_FIRST_AUDIO_BUCKETS = (0.01, 0.02, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0)
_RTF_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0, 10.0)


class TTSMetrics:
    """The TTS side's metrics.

    Args:
        registry: The registry to register on (the server's, so one ``/metrics`` shows both sides).

    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.ready = Gauge(_PREFIX + "ready", "1 once the Magpie model is loaded and warm, 0 otherwise.", registry=registry)
        self.capacity = Gauge(_PREFIX + "capacity_streams", "Concurrent synthesis calls allowed.", registry=registry)
        self.active_streams = Gauge(_PREFIX + "active_streams", "Synthesis calls running now.", registry=registry)
        self.requests = Counter(
            _PREFIX + "requests",
            "Synthesis requests ended, by outcome (completed; truncated: max duration reached; cancelled: the "
            "client went away; failed; client_stalled: the client stopped reading; shutdown).",
            ["outcome"],
            registry=registry,
        )
        self.refused = Counter(
            _PREFIX + "requests_refused",
            "Synthesis requests refused before any audio, by status (invalid_argument, unimplemented, "
            "resource_exhausted, unavailable, unauthenticated).",
            ["status"],
            registry=registry,
        )
        self.audio_seconds = Counter(
            _PREFIX + "audio_sent_seconds", "Synthesised audio sent to clients, seconds.", registry=registry
        )
        self.first_audio_seconds = Histogram(
            _PREFIX + "first_audio_seconds",
            "From a request reaching the engine to its first audio chunk (queueing included), seconds.",
            buckets=_FIRST_AUDIO_BUCKETS,
            registry=registry,
        )
        self.real_time_factor = Histogram(
            _PREFIX + "real_time_factor",
            "Synthesis wall time (first row step to last chunk) over the audio's duration, per request "
            "(below 1: faster than real time).",
            buckets=_RTF_BUCKETS,
            registry=registry,
        )

    def render(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)
