"""``EngineLease``: the engine a ``NemotronSTTService`` session runs on, how it gets it and gives it back.

Either the engine the service was given (``engine=``: started if needed, never stopped here) or the shared one
for its :class:`~pipecat_nemotron.asr.EngineConfig` from a :class:`~pipecat_nemotron.asr.shared.SharedEngines`
registry (loaded on first use, released when the session ends). While it runs, the lease also answers what the
loaded model allows: its latency modes, its languages, its finalize times.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipecat_nemotron.asr import EngineConfig, NemotronEngine
from pipecat_nemotron.asr.boosting import validate_boost_phrases
from pipecat_nemotron.asr.eou import EOU_MODELS, EOU_PIECE, nemo_file_has_eou
from pipecat_nemotron.asr.errors import EndOfUtteranceUnavailableError
from pipecat_nemotron.asr.shared import SharedEngines, shared_engines

__all__ = ["EngineLease"]


class EngineLease:
    """Where one STT session's engine comes from, and what its loaded model allows.

    Args:
        model: Local ``.nemo`` path or model id (ignored when ``engine`` or ``engine_config`` is given).
        model_revision: Pinned revision of a model id.
        device: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        cpu_threads: On CPU, torch's intra-op threads for the model; only with ``model``/``device``.
        engine: A started (or startable) engine to use; never stopped here.
        engine_config: Full engine settings, shared through ``registry``.
        registry: Where shared engines live (None: the process-wide one).

    Raises:
        ValueError: ``cpu_threads`` beside an ``engine`` or ``engine_config``, or a bad device or thread count.

    """

    def __init__(
        self,
        *,
        model: str,
        model_revision: str | None,
        device: str,
        cpu_threads: int | None,
        engine: NemotronEngine | None,
        engine_config: EngineConfig | None,
        registry: SharedEngines | None,
    ) -> None:
        if engine is not None:
            config = engine.config
        elif engine_config is not None:
            config = engine_config
        else:
            config = EngineConfig(model=model, model_revision=model_revision, device=device, cpu_threads=cpu_threads)
        if cpu_threads is not None and config.cpu_threads != cpu_threads:
            raise ValueError(
                "cpu_threads is an engine setting: pass it in engine_config (EngineConfig(cpu_threads=...)), "
                "not beside an engine or engine_config"
            )
        #: The engine's settings (the shared engine's key).
        self.config = config
        self._given = engine
        self._registry = registry or shared_engines
        self._engine: NemotronEngine | None = None

    @property
    def engine(self) -> NemotronEngine | None:
        """The engine acquired for the session (None before :meth:`acquire` and after :meth:`release`)."""
        return self._engine

    @property
    def cold(self) -> bool:
        """Whether the model still has to load (no running engine was given)."""
        return self._given is None or not self._given.running

    def check_boost_limits(self, phrases: Sequence[str]) -> None:
        """Check ``phrases`` against the engine's limits (its model's characters are checked when a stream opens).

        Raises:
            BoostPhraseError: Too many phrases, or one too long.

        """
        validate_boost_phrases(
            phrases, max_phrases=self.config.max_boost_phrases, max_chars=self.config.max_boost_phrase_chars
        )

    def check_eou(self) -> None:
        """Refuse a model without ``<EOU>`` for a service whose turn commit reads it, as the service is built.

        A given engine that runs answers from its loaded model; otherwise a local ``.nemo`` file's vocabulary is
        read (:func:`~pipecat_nemotron.asr.eou.nemo_file_has_eou`). A hub id is checked by the engine when the
        stream opens.

        Raises:
            EndOfUtteranceUnavailableError: The model has no ``<EOU>``; the message names the fix.

        """
        engine = self._given
        has = engine.info.eou if engine is not None and engine.running else nemo_file_has_eou(self.config.model)
        if has is False:
            raise EndOfUtteranceUnavailableError(
                f"the STT's turn commit ends turns on the model's end-of-utterance token ({EOU_PIECE}), and "
                f"{self.config.model!r} has none: load a model that emits it ({', '.join(EOU_MODELS)}; the tiny "
                "one is pipecat_nemotron.models.TINY_EOU_MODEL_PATH), or choose a turn end that does not read it "
                "(turn_end='smart', 'vad' or 'text')"
            )

    async def acquire(self) -> NemotronEngine:
        """Start the given engine, or take the shared one for :attr:`config` (loading it off the event loop).

        Raises:
            ModelLoadError: The model could not load (any error of the engine's ``start()``).

        """
        if self._given is not None:
            await self._given.start()
            self._engine = self._given
        else:
            self._engine = await self._registry.acquire(self.config)
        return self._engine

    async def release(self) -> None:
        """Give a shared engine back to its registry (a given engine keeps running). Idempotent."""
        engine, self._engine = self._engine, None
        if engine is not None and self._given is None:
            await self._registry.release(engine)

    def _running(self) -> NemotronEngine | None:
        """The acquired engine while it runs."""
        return self._engine if self._engine is not None and self._engine.running else None

    def finalize_p99_ms(self) -> float | None:
        """The engine's finalize p99 (its recent finals), ms; None before the engine runs or finalizes."""
        engine = self._engine or self._given
        return engine.finalize_ms_percentile(99.0) if engine is not None and engine.running else None

    def latency_modes(self) -> tuple[int, ...] | None:
        """The loaded model's modes, ms (None until the engine runs)."""
        engine = self._running()
        return engine.info.latency_modes if engine is not None else None

    def language_problem(self, language: Any) -> str | None:
        """The engine's refusal of ``language`` (None until the engine runs; it then checks at stream open)."""
        engine = self._running()
        if engine is None:
            return None
        try:
            engine.resolve_language(language)
        except ValueError as e:
            return str(e)
        return None
