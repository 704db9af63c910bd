"""Scale-out ASR: one GPU process serving many bot processes over WebSockets (protocol ``nemotron-asr.v1``).

* :mod:`pipecat_nemotron.server.protocol` - message types, close codes, version (no heavy imports).
* :mod:`pipecat_nemotron.server.app` - the aiohttp server (``pipecat-nemotron serve``) and its core.
* :mod:`pipecat_nemotron.server.session` - one session, independent of the web framework.
* :mod:`pipecat_nemotron.server.metrics` - Prometheus metrics.
* :mod:`pipecat_nemotron.server.ray_serve` - the Ray Serve deployment (one replica per GPU).

The Pipecat client is :class:`pipecat_nemotron.server_stt.NemotronServerSTTService`.
"""
