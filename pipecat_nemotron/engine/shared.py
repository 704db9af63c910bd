"""A process-wide registry so every service naming the same model and device shares one loaded engine."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from loguru import logger

from pipecat_nemotron.engine.config import EngineConfig
from pipecat_nemotron.engine.engine import NemotronEngine


@dataclass
class _Entry:
    engine: NemotronEngine
    load: asyncio.Task[None]
    refs: int = 0
    pinned: bool = False


class SharedEngines:
    """Ref-counted engines keyed by their :class:`EngineConfig` (model, revision, device, dtype, capacity...).

    The first ``acquire`` starts loading the engine (off the event loop) in a task of its own; concurrent and
    later acquires of the same config wait for that one load. A caller that stops waiting (its session ended)
    does not cancel the load for the others. An engine stays loaded when its last user releases it (a bot
    server keeps serving sessions without reloading), unless ``unload_when_unused`` is set; a preloaded engine
    stays loaded regardless. ``close_all()`` stops every engine at process shutdown.
    """

    def __init__(self, unload_when_unused: bool = False) -> None:
        self.unload_when_unused = unload_when_unused
        self._entries: dict[EngineConfig, _Entry] = {}

    async def acquire(self, config: EngineConfig) -> NemotronEngine:
        """Return the started engine for ``config``, loading it on first use. Call :meth:`release` once done.

        Raises:
            ModelLoadError: Loading failed (the next acquire tries again).

        """
        entry = self._entries.get(config)
        if entry is None:
            engine = NemotronEngine(config)
            load = asyncio.get_running_loop().create_task(
                self._load(config, engine), name=f"nemotron-asr-load:{config.model}"
            )
            # Waiters re-raise a load error themselves; mark it retrieved in case every waiter went away.
            load.add_done_callback(lambda t: t.cancelled() or t.exception())
            entry = _Entry(engine, load)
            self._entries[config] = entry
        await asyncio.shield(entry.load)
        entry.refs += 1
        return entry.engine

    async def _load(self, config: EngineConfig, engine: NemotronEngine) -> None:
        try:
            await engine.start()
        except BaseException:
            if (entry := self._entries.get(config)) is not None and entry.engine is engine:
                del self._entries[config]
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
        entry = self._entries[config]
        if entry.pinned:
            entry.refs -= 1  # one process-lifetime reference is enough
        entry.pinned = True
        logger.info(f"Nemotron ASR model {config.model} ready after {time.perf_counter() - started:.1f} s")
        return engine

    async def release(self, engine: NemotronEngine) -> None:
        """Drop one reference to ``engine`` (stopping it at zero if ``unload_when_unused`` and not preloaded)."""
        for config, entry in list(self._entries.items()):
            if entry.engine is engine:
                entry.refs = max(0, entry.refs - 1)
                if entry.refs == 0 and self.unload_when_unused and not entry.pinned:
                    del self._entries[config]
                    await engine.stop()
                return

    def refs(self, engine: NemotronEngine) -> int:
        """Current users of ``engine`` (a preload counts as one)."""
        return next((e.refs for e in self._entries.values() if e.engine is engine), 0)

    @property
    def engines(self) -> list[NemotronEngine]:
        """Engines loaded or loading."""
        return [e.engine for e in self._entries.values()]

    async def close_all(self) -> None:
        """Stop every engine (process shutdown); a load still running is cancelled."""
        entries, self._entries = list(self._entries.values()), {}
        for entry in entries:
            if not entry.load.done():
                entry.load.cancel()
                await asyncio.gather(entry.load, return_exceptions=True)
            users = entry.refs - (1 if entry.pinned else 0)
            if users:
                logger.warning(f"Stopping ASR engine {entry.engine.config.model} with {users} users left")
            await entry.engine.stop()


#: The registry services use unless given another.
shared_engines = SharedEngines()
