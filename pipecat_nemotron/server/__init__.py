"""Scale-out ASR: one GPU process serving many bot processes over WebSockets (protocol ``nemotron-asr.v1``).

* :mod:`pipecat_nemotron.server.protocol` - message types, close codes, version (no heavy imports).
* :mod:`pipecat_nemotron.server.app` - the public entry point: re-exports the server, its config and runner.
* :mod:`pipecat_nemotron.server.config` - ``ServerConfig`` (validated limits and security), token lists.
* :mod:`pipecat_nemotron.server.service` - ``ASRService``, the framework-independent core (engine, admission,
  auth, limits, metrics).
* :mod:`pipecat_nemotron.server.aiohttp_server` - ``ASRServer``, the aiohttp layer (handlers, handshake guard).
* :mod:`pipecat_nemotron.server.run` - ``run_server``, the process runner (``pipecat-nemotron serve``).
* :mod:`pipecat_nemotron.server.session` - one session, independent of the web framework; its parts
  :mod:`~pipecat_nemotron.server.transport`, :mod:`~pipecat_nemotron.server.pacing`,
  :mod:`~pipecat_nemotron.server.positions`, :mod:`~pipecat_nemotron.server.stream_settings` (latency mode and
  language checked against the loaded model) and :mod:`~pipecat_nemotron.server.errors`.
* :mod:`pipecat_nemotron.server.metrics` - Prometheus metrics.
* :mod:`pipecat_nemotron.server.ray_serve` - the Ray Serve deployment (one replica per GPU).
* :mod:`pipecat_nemotron.server.ray_tts` - the Magpie TTS as a Ray Serve deployment (Riva gRPC through Serve's proxy).

The Pipecat client is :class:`pipecat_nemotron.stt.remote.service.NemotronServerSTTService`.
"""
