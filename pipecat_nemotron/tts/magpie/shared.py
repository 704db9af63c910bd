"""A process-wide registry so every service naming the same Magpie model, device and codec shares one engine."""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from loguru import logger

from pipecat_nemotron.runtime.devices import resolve_device
from pipecat_nemotron.runtime.registry import EngineRegistry
from pipecat_nemotron.tts.magpie.engine import MagpieEngine
from pipecat_nemotron.tts.magpie.options import DEFAULT_MAGPIE_MODEL


class MagpieKey(NamedTuple):
    """What makes two Magpie engines the same: the checkpoint, the resolved device and the codec override."""

    model: str
    device: str
    codec_model_path: str | None


def _cannot_serve(engine: MagpieEngine) -> bool:
    """A registered engine to replace: closed, failed to load, or its worker stopped on an error of its own."""
    return not engine.serving or engine.load_error is not None


class SharedMagpieEngines(EngineRegistry[MagpieKey, MagpieEngine]):
    """Ref-counted engines keyed by (model, device, codec): services naming the same ones share one loaded model.

    The bookkeeping is the one both registries share (:class:`~pipecat_nemotron.runtime.registry.EngineRegistry`): an
    engine stays loaded when its last user releases it (a bot server keeps serving sessions without reloading),
    unless ``unload_when_unused`` is set; a preloaded engine stays loaded regardless; :meth:`close_all` stops
    every engine at process shutdown. ``acquire`` and ``release`` are synchronous (the engine loads on its own
    thread) and thread-safe.

    Args:
        unload_when_unused: Close an engine (freeing its model) when its last user releases it.

    """

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
        key = MagpieKey(model, resolve_device(device), codec_model_path)
        held, orphan = self._checkout(
            key,
            lambda: MagpieEngine(
                model, device=key.device, codec_model_path=codec_model_path, **engine_kwargs
            ),
            hold=True,
            replace_if=_cannot_serve,
        )
        if orphan is not None:
            orphan.close()
        return held.engine

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
        self._pin(engine)
        logger.info(f"Magpie TTS model {model} ready after {time.perf_counter() - started:.1f} s")
        return engine

    def release(self, engine: MagpieEngine) -> None:
        """Drop one reference to ``engine``; at zero, close it if ``unload_when_unused`` (or if it was replaced)."""
        if self._drop(engine):
            engine.close()

    def close_all(self) -> None:
        """Close every engine (process shutdown)."""
        for held in self._take_all():
            held.engine.close()


shared_magpie_engines = SharedMagpieEngines()
"""The registry ``MagpieTTSService`` uses."""
