"""A process-wide registry so every service naming the same model and device shares one loaded engine."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from loguru import logger

from pipecat_nemotron.engine.config import EngineConfig
from pipecat_nemotron.engine.engine import NemotronEngine


@dataclass
class _Entry:
    engine: NemotronEngine
    refs: int = 0
    ready: asyncio.Future[None] | None = None


class SharedEngines:
    """Ref-counted engines keyed by their :class:`EngineConfig` (model, revision, device, dtype, capacity...).

    The first ``acquire`` loads and starts the engine (off the event loop); concurrent and later acquires of
    the same config get the same engine. An engine stays loaded when its last user releases it (a bot server
    keeps serving sessions without reloading), unless ``unload_when_unused`` is set; ``close_all()`` stops
    every engine at process shutdown.
    """

    def __init__(self, unload_when_unused: bool = False) -> None:
        self.unload_when_unused = unload_when_unused
        self._entries: dict[EngineConfig, _Entry] = {}

    async def acquire(self, config: EngineConfig) -> NemotronEngine:
        """Return the started engine for ``config``, loading it on first use.

        Raises:
            ModelLoadError: Loading failed (the next acquire tries again).

        """
        entry = self._entries.get(config)
        if entry is None:
            entry = _Entry(NemotronEngine(config))
            entry.ready = asyncio.get_running_loop().create_future()
            self._entries[config] = entry
            try:
                await entry.engine.start()
            except BaseException as e:
                del self._entries[config]
                entry.ready.set_exception(e)
                entry.ready.exception()  # mark retrieved: waiters re-raise it themselves
                raise
            entry.ready.set_result(None)
        elif entry.ready is not None and not entry.ready.done():
            await asyncio.shield(entry.ready)
        entry.refs += 1
        return entry.engine

    async def release(self, engine: NemotronEngine) -> None:
        """Drop one reference to ``engine`` (stopping it at zero if ``unload_when_unused``)."""
        for config, entry in list(self._entries.items()):
            if entry.engine is engine:
                entry.refs = max(0, entry.refs - 1)
                if entry.refs == 0 and self.unload_when_unused:
                    del self._entries[config]
                    await engine.stop()
                return

    def refs(self, engine: NemotronEngine) -> int:
        """Current users of ``engine``."""
        return next((e.refs for e in self._entries.values() if e.engine is engine), 0)

    @property
    def engines(self) -> list[NemotronEngine]:
        """Engines currently loaded."""
        return [e.engine for e in self._entries.values()]

    async def close_all(self) -> None:
        """Stop every engine (process shutdown)."""
        entries, self._entries = list(self._entries.values()), {}
        for entry in entries:
            if entry.refs:
                logger.warning(
                    f"Stopping ASR engine {entry.engine.config.model} with {entry.refs} users left"
                )
            await entry.engine.stop()


#: The registry services use unless given another.
shared_engines = SharedEngines()
