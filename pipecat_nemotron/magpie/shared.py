"""A process-wide registry so every service naming the same Magpie model, device and codec shares one engine."""

from __future__ import annotations

import threading
import time
from typing import Any

from loguru import logger

from pipecat_nemotron.devices import resolve_device
from pipecat_nemotron.magpie.engine import MagpieEngine
from pipecat_nemotron.magpie.options import DEFAULT_MAGPIE_MODEL

_EngineKey = tuple[str, str, str | None]


class SharedMagpieEngines:
    """Ref-counted engines keyed by (model, device, codec): services naming the same ones share one loaded model.

    An engine stays loaded when its last user releases it (a bot server keeps serving sessions without reloading),
    unless ``unload_when_unused`` is set; :meth:`close_all` stops every engine at process shutdown. Thread-safe.
    """

    def __init__(self, unload_when_unused: bool = False) -> None:
        """Create an empty registry.

        Args:
            unload_when_unused: Close an engine (freeing its model) when its last user releases it.

        """
        self.unload_when_unused = unload_when_unused
        self._lock = threading.Lock()
        self._engines: dict[_EngineKey, MagpieEngine] = {}
        self._refs: dict[int, int] = {}
        # Engines loaded by :meth:`preload`: each holds one reference for the life of the process.
        self._pinned: set[int] = set()

    def acquire(
        self,
        model: str = DEFAULT_MAGPIE_MODEL,
        *,
        device: str = "auto",
        codec_model_path: str | None = None,
        **engine_kwargs: Any,
    ) -> MagpieEngine:
        """Return the engine for (model, device, codec), creating it (and starting its load) on first use.

        Call :meth:`release` once per acquire. An engine whose load failed is replaced on the next acquire.

        Args:
            model: Hub id or ``.nemo`` path.
            device: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (``"auto"`` is resolved before lookup).
            codec_model_path: Optional codec override (part of the key).
            **engine_kwargs: Further :class:`MagpieEngine` arguments, used only when the engine is created.

        Returns:
            The shared engine (possibly still loading: see :meth:`MagpieEngine.wait_ready`).

        """
        key = (model, resolve_device(device), codec_model_path)
        with self._lock:
            engine = self._engines.get(key)
            if engine is None or engine.closed or engine._load_error is not None:
                engine = MagpieEngine(
                    model, device=key[1], codec_model_path=codec_model_path, **engine_kwargs
                )
                self._engines[key] = engine
            self._refs[id(engine)] = self._refs.get(id(engine), 0) + 1
            return engine

    async def preload(
        self,
        model: str = DEFAULT_MAGPIE_MODEL,
        *,
        device: str = "auto",
        codec_model_path: str | None = None,
        **engine_kwargs: Any,
    ) -> MagpieEngine:
        """Load and warm up the engine for (model, device, codec) now and keep it loaded for the process.

        Call it at process start so no session waits for the model (``MagpieTTSService.start`` waits for a
        loading model, and Pipecat gives a pipeline's ``StartFrame`` only 20 s). Arguments as :meth:`acquire`.

        Raises:
            MagpieEngineError: Loading failed (the cause is chained).

        """
        started = time.perf_counter()
        logger.info(f"Loading the Magpie TTS model {model} ({device}) at process start...")
        engine = self.acquire(model, device=device, codec_model_path=codec_model_path, **engine_kwargs)
        try:
            await engine.wait_ready()
        except BaseException:
            self.release(engine)
            raise
        with self._lock:
            if id(engine) in self._pinned:
                self._refs[id(engine)] -= 1  # one process-lifetime reference is enough
            self._pinned.add(id(engine))
        logger.info(f"Magpie TTS model {model} ready after {time.perf_counter() - started:.1f} s")
        return engine

    def release(self, engine: MagpieEngine) -> None:
        """Drop one reference to ``engine``; at zero, close it if ``unload_when_unused`` (or if it was replaced)."""
        with self._lock:
            refs = self._refs.get(id(engine), 0) - 1
            if refs > 0:
                self._refs[id(engine)] = refs
                return
            self._refs.pop(id(engine), None)
            registered = engine in self._engines.values()
            if registered and not self.unload_when_unused:
                return
            for key in [k for k, e in self._engines.items() if e is engine]:
                del self._engines[key]
        engine.close()

    def refs(self, engine: MagpieEngine) -> int:
        """Current users of ``engine``."""
        with self._lock:
            return self._refs.get(id(engine), 0)

    def close_all(self) -> None:
        """Close every engine (process shutdown)."""
        with self._lock:
            engines = list(self._engines.values())
            self._engines.clear()
            self._refs.clear()
            self._pinned.clear()
        for engine in engines:
            engine.close()


shared_magpie_engines = SharedMagpieEngines()
"""The registry ``MagpieTTSService`` uses."""
