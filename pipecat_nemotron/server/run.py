"""The model server process: :func:`run_server` (``pipecat-nemotron serve``, :mod:`pipecat_nemotron.cli`).

It runs an :class:`~pipecat_nemotron.server.aiohttp_server.ASRServer` until SIGINT/SIGTERM, then drains it.
"""

from __future__ import annotations

import asyncio

from loguru import logger

from pipecat_nemotron.asr import EngineConfig
from pipecat_nemotron.server.aiohttp_server import ASRServer
from pipecat_nemotron.server.config import ServerConfig
from pipecat_nemotron.server.tts_config import TTSHostConfig


async def run_server(
    engine_config: EngineConfig | None,
    config: ServerConfig,
    stop: asyncio.Event | None = None,
    tts_config: TTSHostConfig | None = None,
) -> int:
    """Run a server until ``stop`` is set (or SIGINT/SIGTERM), then drain and exit.

    Args:
        engine_config: ASR engine to load (None: no ASR).
        config: Server settings.
        stop: Event that ends the server (default: one set by SIGINT/SIGTERM).
        tts_config: Magpie TTS to host beside it (None: no TTS; needs ``config.grpc_port``).

    Returns:
        Process exit code: 0 after a clean shutdown, 1 if a model failed to load.

    """
    import signal

    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - non-Unix or not the main thread
            pass
    server = ASRServer(engine_config, config, tts=tts_config)
    await server.start(wait_ready=False)
    ready = loop.create_task(server.wait_ready(), name="asr-wait-ready")
    stop_wait = loop.create_task(stop.wait())
    await asyncio.wait({ready, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
    if ready.done() and ready.exception() is not None:
        logger.error(f"model server: a model failed to load: {ready.exception()}")
        stop_wait.cancel()
        await server.stop(drain_timeout_s=0)
        return 1
    await stop_wait
    logger.info("model server: shutdown requested")
    await server.stop()  # cancels a load still under way, and with it ``ready``
    return 0
