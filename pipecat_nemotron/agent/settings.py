"""What a voice agent runs: the ASR, LLM and TTS settings a bot reads from ``.env``, and the services they build.

:class:`AgentSettings` is the one validated settings object of the agent; :meth:`AgentSettings.from_env` reads it
(pass ``os.environ`` after :func:`~pipecat_nemotron.llm.env.load_env_file`). With nothing configured it names the
embedded defaults: the bundled tiny ASR on CPU (the real model on a GPU), llama.cpp's server with a small GGUF as
the LLM, and the tiny Magpie as the TTS (:class:`~pipecat_nemotron.agent.process.AgentProcess` starts them).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from loguru import logger
from pipecat.services.llm_service import LLMService
from pipecat.services.stt_service import STTService
from pipecat.services.tts_service import TTSService

from pipecat_nemotron.agent.turn_end import (
    EOU_TURN_END_MODES,
    TURN_END_MODES,
    TurnEndMode,
    turn_commit_for,
    validate_turn_end,
)
from pipecat_nemotron.asr.config import DEFAULT_MODEL, EngineConfig, validate_latency_ms
from pipecat_nemotron.asr.eou import EOU_MODELS, EOU_PIECE, nemo_file_has_eou
from pipecat_nemotron.llm.embedded import EmbeddedLLMSettings
from pipecat_nemotron.llm.env import (
    ENV_API_KEY,
    ENV_BACKEND,
    ENV_BASE_URL,
    ENV_MODEL,
    ENV_NVIDIA_API_KEY,
    ENV_PREFIX,
)
from pipecat_nemotron.stt.eager import DEFAULT_EAGER_SILENCE_MS, EagerSettings

__all__ = ["ENV_TTS_EMBEDDED", "AgentSettings"]

ENV_TTS_EMBEDDED = "MAGPIE_TTS_EMBEDDED"
"""``0``/``false``: no embedded Magpie when none is configured (the agent answers in text only)."""

_BOOLEANS = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}


@dataclass(frozen=True)
class AgentSettings:
    """Which ASR, LLM and TTS a bot uses; bots build it from ``.env`` with :meth:`from_env`.

    Attributes:
        asr_model: ASR model id or ``.nemo`` path (None: the GPU model, or the tiny model without a GPU).
        asr_device: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (also used for Magpie in process).
        asr_latency_ms: One of the model's modes: 80, 160, 560 or 1120 (the multilingual model adds 320).
        asr_language: The multilingual model's language (``es-ES``, ``es``, ``auto``); None: its default
            (``auto``). The English model accepts English only.
        asr_eager_end_of_turn: Start answering when the user pauses for ``asr_eager_silence_ms``, before the VAD
            commits the turn (``NemotronSTTService(eager=EagerSettings())``); each withdrawn prediction
            costs an LLM request. Off by default.
        asr_eager_silence_ms: The pause that predicts the end of a turn, ms.
        asr_cpu_threads: On CPU, torch's intra-op threads for the ASR model (``EngineConfig.cpu_threads``); None:
            half the cores.
        asr_final_timeout_s: At the end of a session, how long to wait for the finals the engine still decodes,
            seconds (``NemotronSTTService(final_timeout_s=...)``); None: the service's default (60 s).
        asr_boost_phrases: Phrases to boost in every session (``NemotronSTTService(boost_phrases=...)``), spelled
            and cased as the model writes them; empty: none.
        turn_end: How a VAD stop ends the user's turn: ``"smart"`` (Smart Turn on the audio), ``"vad"`` (every
            VAD stop), ``"text"`` (the final's words with Smart Turn), ``"eou"`` (the recogniser's own ``<EOU>``)
            or ``"eou_smart"`` (``<EOU>``, else Smart Turn); :mod:`pipecat_nemotron.agent.turn_end`.
            None: ``"smart"`` with the eager end of turn off (Pipecat's default), ``"vad"`` with it on. The EOU
            modes need a model that emits ``<EOU>``: without ``asr_model`` on CPU they use the bundled
            ``tiny_nemotron_asr_eou.nemo``; a model without the token is refused here.
        llm_configured: Whether an LLM endpoint was configured (``NEMOTRON_LLM_BASE_URL`` or ``_BACKEND``).
        llm_env: The environment the LLM settings are read from (see ``NemotronLLMSettings.from_env``).
        llm_embedded: The llama.cpp server an :class:`~pipecat_nemotron.agent.process.AgentProcess` starts when
            no LLM is configured (None: none; ``NEMOTRON_LLM_EMBEDDED=0`` turns it off). Once it runs,
            :meth:`with_llm_server` points ``llm_env`` at it and keeps this field, so :meth:`describe` names it.
        tts_model: Magpie model id or ``.nemo`` path to run in process (None: none).
        tts_embedded: With no Magpie configured, an ``AgentProcess`` provides one: the real Magpie on a CUDA GPU,
            else the bundled tiny Magpie (``docs/TINY_MAGPIE.md``). ``MAGPIE_TTS_EMBEDDED=0`` turns it off.
        tts_max_duration_s: The most audio one sentence may take, seconds (None: Magpie's default, 20 s).
        tts_voice: Magpie voice (john, sofia, aria, jason, leo).
        tts_nim_server: ``host:port`` of a Magpie NIM (gRPC), used instead of ``tts_model`` when set.
        tts_nim_voice: NIM voice id.

    """

    asr_model: str | None = None
    asr_device: str = "auto"
    asr_latency_ms: int = 160
    asr_language: str | None = None
    asr_eager_end_of_turn: bool = False
    asr_eager_silence_ms: float = DEFAULT_EAGER_SILENCE_MS
    asr_cpu_threads: int | None = None
    asr_final_timeout_s: float | None = None
    asr_boost_phrases: tuple[str, ...] = ()
    turn_end: TurnEndMode | None = None
    llm_configured: bool = False
    llm_env: Mapping[str, str] = field(default_factory=dict, repr=False)  # may hold an API key
    llm_embedded: EmbeddedLLMSettings | None = None
    tts_model: str | None = None
    tts_embedded: bool = False
    tts_max_duration_s: float | None = None
    tts_voice: str = "aria"
    tts_nim_server: str | None = None
    tts_nim_voice: str = "Magpie-Multilingual.EN-US.Aria"

    def __post_init__(self) -> None:
        validate_latency_ms(self.asr_latency_ms)
        if self.turn_end is not None:
            validate_turn_end(self.turn_end)
        if self.turn_end in EOU_TURN_END_MODES:
            model = self.asr_model_name()
            if model == DEFAULT_MODEL or nemo_file_has_eou(model) is False:
                raise ValueError(
                    f"turn_end={self.turn_end!r} ends turns on the recogniser's {EOU_PIECE} token, and the ASR model "
                    f"{model!r} has none: set asr_model (NEMOTRON_ASR_MODEL) to one that emits it "
                    f"({', '.join(EOU_MODELS)}; the tiny one is pipecat_nemotron/assets/tiny_nemotron_asr_eou.nemo), "
                    "or choose turn_end 'smart', "
                    "'vad' or 'text'"
                )
        if not self.asr_eager_silence_ms > 0:
            raise ValueError(f"asr_eager_silence_ms must be > 0 (ms), got {self.asr_eager_silence_ms!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> AgentSettings:
        """Read the agent's settings from ``environ`` (pass ``os.environ`` after ``load_env_file()``).

        Keys: ``NEMOTRON_ASR_MODEL``/``_DEVICE``/``_LATENCY_MS``/``_LANGUAGE``, ``NEMOTRON_ASR_EAGER_END_OF_TURN`` (``1``/``true``
        to turn it on) and ``NEMOTRON_ASR_EAGER_SILENCE_MS``, ``NEMOTRON_CPU_THREADS`` (torch threads of the ASR
        model on CPU), ``NEMOTRON_ASR_FINAL_TIMEOUT_S`` (seconds), ``NEMOTRON_ASR_BOOST_PHRASES`` (phrases separated
        by commas: ``Okafor, Zyrtec, Dr. Mbeki``), ``NEMOTRON_TURN_END`` (``smart``, ``vad``,
        ``text``, ``eou``, ``eou_smart``), ``NEMOTRON_LLM_*`` (see ``docs/LLM.md``; with neither ``NEMOTRON_LLM_BASE_URL`` nor
        ``_BACKEND`` set, the embedded llama.cpp server: ``NEMOTRON_LLM_EMBEDDED``/``_EMBEDDED_GGUF``/
        ``_EMBEDDED_THREADS``), ``MAGPIE_TTS_MODEL``/``_VOICE``, ``MAGPIE_NIM_SERVER``/``_VOICE`` (with neither
        model nor NIM set, the embedded Magpie; ``MAGPIE_TTS_EMBEDDED=0`` turns it off). Empty values count as unset.

        Raises:
            ValueError: A value does not parse (the message names the key).

        """

        def get(key: str) -> str | None:
            value = environ.get(key, "").strip()
            return value or None

        latency = get("NEMOTRON_ASR_LATENCY_MS") or "160"
        if not latency.isdigit():
            raise ValueError(
                f"NEMOTRON_ASR_LATENCY_MS must be a mode in ms (80, 160, 320, 560, 1120), got {latency!r}"
            )
        llm_keys = {k: v for k, v in environ.items() if k.startswith(ENV_PREFIX) or k == ENV_NVIDIA_API_KEY}
        eager = (get("NEMOTRON_ASR_EAGER_END_OF_TURN") or "0").lower()
        if eager not in _BOOLEANS:
            raise ValueError(f"NEMOTRON_ASR_EAGER_END_OF_TURN must be 1/0 or true/false, got {eager!r}")
        silence = get("NEMOTRON_ASR_EAGER_SILENCE_MS") or str(DEFAULT_EAGER_SILENCE_MS)
        try:
            silence_ms = float(silence)
        except ValueError:
            raise ValueError(
                f"NEMOTRON_ASR_EAGER_SILENCE_MS must be a number of ms, got {silence!r}"
            ) from None
        threads = get("NEMOTRON_CPU_THREADS")
        if threads is not None and not (threads.isdigit() and int(threads) > 0):
            raise ValueError(f"NEMOTRON_CPU_THREADS must be a positive number of threads, got {threads!r}")
        final_timeout = get("NEMOTRON_ASR_FINAL_TIMEOUT_S")
        try:
            final_timeout_s = float(final_timeout) if final_timeout is not None else None
        except ValueError:
            raise ValueError(
                f"NEMOTRON_ASR_FINAL_TIMEOUT_S must be a number of seconds, got {final_timeout!r}"
            ) from None
        llm_configured = bool(get(ENV_BASE_URL) or get(ENV_BACKEND))
        llm_embedded = None if llm_configured else EmbeddedLLMSettings.from_env(environ)
        tts_switch = (get(ENV_TTS_EMBEDDED) or "1").lower()
        if tts_switch not in _BOOLEANS:
            raise ValueError(f"{ENV_TTS_EMBEDDED} must be 1/0 or true/false, got {tts_switch!r}")
        tts_configured = bool(get("MAGPIE_TTS_MODEL") or get("MAGPIE_NIM_SERVER"))
        has_llm = llm_configured or llm_embedded is not None
        turn_end = get("NEMOTRON_TURN_END")
        if turn_end is not None and turn_end.lower() not in TURN_END_MODES:
            raise ValueError(f"NEMOTRON_TURN_END must be one of {list(TURN_END_MODES)}, got {turn_end!r}")
        return cls(
            asr_model=get("NEMOTRON_ASR_MODEL"),
            turn_end=turn_end.lower() if turn_end is not None else None,  # type: ignore[arg-type]
            asr_cpu_threads=int(threads) if threads is not None else None,
            asr_final_timeout_s=final_timeout_s,
            asr_boost_phrases=tuple(p.strip() for p in (get("NEMOTRON_ASR_BOOST_PHRASES") or "").split(",") if p.strip()),
            asr_device=get("NEMOTRON_ASR_DEVICE") or "auto",
            asr_latency_ms=int(latency),
            asr_language=get("NEMOTRON_ASR_LANGUAGE"),
            asr_eager_end_of_turn=_BOOLEANS[eager],
            asr_eager_silence_ms=silence_ms,
            llm_configured=llm_configured,
            llm_env=llm_keys,
            llm_embedded=llm_embedded,
            tts_model=get("MAGPIE_TTS_MODEL"),
            tts_embedded=has_llm and not tts_configured and _BOOLEANS[tts_switch],
            tts_voice=get("MAGPIE_TTS_VOICE") or "aria",
            tts_nim_server=get("MAGPIE_NIM_SERVER"),
            tts_nim_voice=get("MAGPIE_NIM_VOICE") or "Magpie-Multilingual.EN-US.Aria",
        )

    def with_llm_server(self, base_url: str, model: str) -> AgentSettings:
        """These settings with the LLM at ``base_url`` serving ``model`` (the embedded server once it runs)."""
        env = {**self.llm_env, ENV_BASE_URL: base_url, ENV_MODEL: model, ENV_API_KEY: "none"}
        env.pop(ENV_BACKEND, None)
        return replace(self, llm_configured=True, llm_env=env)

    def with_tts_model(self, model: str, max_duration_s: float | None = None) -> AgentSettings:
        """These settings with Magpie ``model`` (a ``.nemo`` path or hub id) in process.

        Args:
            model: The model.
            max_duration_s: The most audio one sentence may take, seconds (None: Magpie's default).

        """
        return replace(self, tts_model=model, tts_max_duration_s=max_duration_s)

    def asr_model_name(self) -> str:
        """The ASR model these settings load.

        ``asr_model``, else the device's default (the bundled tiny model on CPU; its EOU fine-tune with an EOU
        ``turn_end``).
        """
        from pipecat_nemotron.models import TINY_EOU_MODEL_PATH, TINY_MODEL_PATH, default_asr_model

        if self.asr_model:
            return self.asr_model
        model = default_asr_model(self.asr_device)
        if self.turn_end in EOU_TURN_END_MODES and model == str(TINY_MODEL_PATH) and TINY_EOU_MODEL_PATH.exists():
            return str(TINY_EOU_MODEL_PATH)
        return model

    def asr_engine_config(self) -> EngineConfig:
        """The ASR engine these settings name (the key services and :meth:`preload` share it under)."""
        return EngineConfig(
            model=self.asr_model_name(),
            device=self.asr_device,
            cpu_threads=self.asr_cpu_threads,
        )

    def create_stt(self, **kwargs: Any) -> STTService:
        """The in-process Nemotron STT service (shared engine)."""
        from pipecat_nemotron.stt.local import NemotronSTTService

        if self.asr_eager_end_of_turn:
            commit = None
            if self.turn_end is not None:
                commit = turn_commit_for(self.turn_end, language=(self.asr_language or "en").split("-")[0])
            kwargs.setdefault("eager", EagerSettings(silence_ms=self.asr_eager_silence_ms, turn_commit=commit))
        elif self.turn_end in EOU_TURN_END_MODES:  # the STT owns turn detection: its <EOU> commits the turn
            kwargs.setdefault("turn_commit", turn_commit_for(self.turn_end))
        kwargs.setdefault("language", self.asr_language)
        if self.asr_final_timeout_s is not None:
            kwargs.setdefault("final_timeout_s", self.asr_final_timeout_s)
        kwargs.setdefault("boost_phrases", self.asr_boost_phrases or None)
        return NemotronSTTService(
            engine_config=self.asr_engine_config(), latency_ms=self.asr_latency_ms, **kwargs
        )

    async def preload(self) -> None:
        """Load the ASR engine and the in-process Magpie model now, side by side, and keep them loaded.

        Call it at process start, before the first session (under Pipecat's development runner, see
        :func:`pipecat_nemotron.agent.runner.preload_when_runner_starts`): a model that loads at the first
        ``StartFrame`` makes the first user's transcripts late and can exceed Pipecat's 20 s StartFrame timeout.
        Later services built from these settings share the loaded models.

        Raises:
            ModelLoadError: The ASR model could not be loaded.
            MagpieEngineError: The Magpie model could not be loaded.

        """
        from pipecat_nemotron.asr.shared import shared_engines

        loads = [shared_engines.preload(self.asr_engine_config())]
        if self.tts_model and not self.tts_nim_server:
            from pipecat_nemotron.tts.magpie import shared_magpie_engines

            loads.append(shared_magpie_engines.preload(self.tts_model, device=self.asr_device))
        started = time.perf_counter()
        await asyncio.gather(*loads)
        logger.info(f"Models loaded at process start in {time.perf_counter() - started:.1f} s")

    def create_llm(self) -> LLMService | None:
        """The Nemotron Nano LLM service, or None when no endpoint is configured."""
        if not self.llm_configured:
            return None
        from pipecat_nemotron.llm.service import NemotronLLMSettings, create_nemotron_llm

        return create_nemotron_llm(NemotronLLMSettings.from_env(self.llm_env))

    async def check_llm(self) -> str | None:
        """At session start: check once that the configured LLM server answers (an error naming its URL if not).

        Returns:
            None when it answered or no LLM is configured, else the error message (also logged).

        """
        if not self.llm_configured:
            return None
        from pipecat_nemotron.llm.check import check_llm_endpoint
        from pipecat_nemotron.llm.service import NemotronLLMSettings

        llm = NemotronLLMSettings.from_env(self.llm_env)
        return await check_llm_endpoint(llm.base_url, llm.api_key)

    def create_tts(self) -> TTSService | None:
        """Magpie as a NIM (Pipecat's ``NvidiaTTSService``) or in process, or None when neither is configured."""
        if self.tts_nim_server:
            from pipecat.services.nvidia.tts import NvidiaTTSService

            return NvidiaTTSService(server=self.tts_nim_server, use_ssl=False, voice_id=self.tts_nim_voice)
        if self.tts_model:
            from pipecat_nemotron.tts.magpie.options import MagpieSynthesisOptions
            from pipecat_nemotron.tts.service import MagpieTTSService

            options = None
            if self.tts_max_duration_s is not None:
                options = MagpieSynthesisOptions(max_duration_s=self.tts_max_duration_s)
            return MagpieTTSService(
                model=self.tts_model,
                device=self.asr_device,
                settings=MagpieTTSService.Settings(voice=self.tts_voice),
                options=options,
            )
        return None

    def describe(self) -> list[str]:
        """One line per stage saying what runs, or how to configure it."""
        eager = (
            f", eager end of turn after {self.asr_eager_silence_ms:g} ms"
            if self.asr_eager_end_of_turn
            else ""
        )
        lines = [
            f"ASR: {self.asr_model or 'default'} ({self.asr_latency_ms} ms mode, device {self.asr_device}"
            f"{', language ' + self.asr_language if self.asr_language else ''}"
            f"{f', {self.asr_cpu_threads} CPU threads' if self.asr_cpu_threads else ''}{eager}"
            f"{f', turn end: {self.turn_end}' if self.turn_end else ''}"
            f"{f', {len(self.asr_boost_phrases)} boosted phrase(s)' if self.asr_boost_phrases else ''})"
        ]
        if self.llm_embedded is not None:
            where = f" at {self.llm_env[ENV_BASE_URL]}" if self.llm_configured else " (starts with the process)"
            lines.append(self.llm_embedded.describe() + where)
        elif self.llm_configured:
            lines.append(
                f"LLM: {self.llm_env.get('NEMOTRON_LLM_MODEL') or 'preset model'} at "
                f"{self.llm_env.get('NEMOTRON_LLM_BASE_URL') or 'the preset URL'}"
            )
        else:
            lines.append(
                "LLM: not configured (set NEMOTRON_LLM_BASE_URL in .env, see docs/LLM.md) — ASR only"
            )
        if self.tts_nim_server:
            lines.append(f"TTS: Magpie NIM at {self.tts_nim_server}")
        elif self.tts_model:
            lines.append(f"TTS: Magpie in process ({self.tts_model}, voice {self.tts_voice})")
        elif self.tts_embedded:
            lines.append("TTS: embedded Magpie (starts with the process: the tiny one on CPU, the real one on a GPU)")
        else:
            lines.append(
                "TTS: not configured (set MAGPIE_TTS_MODEL or MAGPIE_NIM_SERVER in .env) — no speech"
            )
        return lines
