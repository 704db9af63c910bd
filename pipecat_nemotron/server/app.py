"""The model server: ASR over WebSockets, health/readiness/metrics over HTTP, optionally TTS and Riva gRPC.

One process hosts the ASR engine, the Magpie TTS engine, or both; NVIDIA Riva's gRPC API (``--grpc-port``)
serves both engines, the WebSocket protocol the ASR.

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

This module is the server's public entry point; the code lives in small modules:

* :mod:`pipecat_nemotron.server.config` - :class:`ServerConfig` (validated), :func:`is_loopback`, :func:`tokens_from`.
* :mod:`pipecat_nemotron.server.service` - :class:`ASRService`, the framework-independent core.
* :mod:`pipecat_nemotron.server.aiohttp_server` - :class:`ASRServer`, :class:`AiohttpTransport`, the handshake guard.
* :mod:`pipecat_nemotron.server.run` - :func:`run_server`, the process runner.
* :mod:`pipecat_nemotron.server.tts_host` - :class:`TTSHost`, the Magpie TTS side (config in
  :mod:`~pipecat_nemotron.server.tts_config`, metrics in :mod:`~pipecat_nemotron.server.tts_metrics`).
* :mod:`pipecat_nemotron.server.grpc_app` - NVIDIA Riva's gRPC API (``--grpc-port``; docs/RIVA.md), with
  :mod:`~pipecat_nemotron.server.riva_asr` (over :mod:`~pipecat_nemotron.server.recognition`) and
  :mod:`~pipecat_nemotron.server.riva_tts`.
"""

from __future__ import annotations

from pipecat_nemotron.server.aiohttp_server import AiohttpTransport, ASRServer, HandshakeGuard
from pipecat_nemotron.server.config import ServerConfig, is_loopback, tokens_from
from pipecat_nemotron.server.run import run_server
from pipecat_nemotron.server.service import ASRService
from pipecat_nemotron.server.tts_config import TTSHostConfig
from pipecat_nemotron.server.tts_host import SynthesisRequest, TTSHost

__all__ = [
    "ASRServer",
    "ASRService",
    "SynthesisRequest",
    "TTSHost",
    "TTSHostConfig",
    "AiohttpTransport",
    "HandshakeGuard",
    "ServerConfig",
    "is_loopback",
    "run_server",
    "tokens_from",
]
