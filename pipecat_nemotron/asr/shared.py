"""A process-wide registry so every service naming the same model and device shares one loaded engine."""

from __future__ import annotations

import asyncio
import time

from loguru import logger

from pipecat_nemotron.asr.config import EngineConfig
from pipecat_nemotron.asr.engine import NemotronEngine
from pipecat_nemotron.runtime.registry import EngineRegistry


class SharedEngines(EngineRegistry[EngineConfig, NemotronEngine]):
    """Ref-counted engines keyed by their :class:`EngineConfig` (model, revision, device, dtype, capacity...).

    The first ``acquire`` starts loading the engine (off the event loop) in a task of its own; concurrent and
    later acquires of the same config wait for that one load. A caller that stops waiting (its session ended)
    does not cancel the load for the others. An engine stays loaded when its last user releases it (a bot
    server keeps serving sessions without reloading), unless ``unload_when_unused`` is set; a preloaded engine
    stays loaded regardless. ``close_all()`` stops every engine at process shutdown. The bookkeeping is the
    one both registries share (:class:`~pipecat_nemotron.runtime.registry.EngineRegistry`).

    Args:
        unload_when_unused: Stop an engine (freeing its model) when its last user releases it.

    """

    def __init__(self, unload_when_unused: bool = False) -> None:
        super().__init__(unload_when_unused)
        self._loads: dict[NemotronEngine, asyncio.Task[None]] = {}

    async def acquire(self, config: EngineConfig) -> NemotronEngine:
        """Return the started engine for ``config``, loading it on first use. Call :meth:`release` once done.

        Raises:
            ModelLoadError: Loading failed (the next acquire tries again).

        """
        held, _ = self._checkout(config, lambda: self._start_loading(config), hold=False)
        await asyncio.shield(self._loads[held.engine])
        return self._hold(held)

    def _start_loading(self, config: EngineConfig) -> NemotronEngine:
        engine = NemotronEngine(config)
        load = asyncio.get_running_loop().create_task(
            self._load(config, engine), name=f"nemotron-asr-load:{config.model}"
        )
        # Waiters re-raise a load error themselves; mark it retrieved in case every waiter went away.
        load.add_done_callback(lambda t: t.cancelled() or t.exception())
        self._loads[engine] = load
        return engine

    async def _load(self, config: EngineConfig, engine: NemotronEngine) -> None:
        try:
            await engine.start()
        except BaseException:
            self._forget(config, engine)
            self._loads.pop(engine, None)
            raise

    async def preload(self, config: EngineConfig) -> NemotronEngine:
        """Load and warm up the engine for ``config`` now and keep it loaded for the life of the process.

        Call it at process start, before a bot accepts sessions (Pipecat's runner, a web server's startup
        hook, or before ``runner.run()``), so no session waits for the model. Services created later with the
        same config (and this registry) get this engine at once.

        Raises:
            ModelLoadError: Loading failed.

        """
        started = time.perf_counter()
        logger.info(f"Loading the Nemotron ASR model {config.model} ({config.device}) at process start...")
        engine = await self.acquire(config)
        self._pin(engine)
        logger.info(f"Nemotron ASR model {config.model} ready after {time.perf_counter() - started:.1f} s")
        return engine

    async def release(self, engine: NemotronEngine) -> None:
        """Drop one reference to ``engine`` (stopping it at zero if ``unload_when_unused`` and not preloaded)."""
        if self._drop(engine):
            self._loads.pop(engine, None)
            await engine.stop()

    async def close_all(self) -> None:
        """Stop every engine (process shutdown); a load still running is cancelled."""
        for held in self._take_all():
            load = self._loads.pop(held.engine, None)
            if load is not None and not load.done():
                load.cancel()
                await asyncio.gather(load, return_exceptions=True)
            users = held.refs - (1 if held.pinned else 0)
            if users:
                logger.warning(f"Stopping ASR engine {held.engine.config.model} with {users} users left")
            await held.engine.stop()


#: The registry services use unless given another.
shared_engines = SharedEngines()
