"""One function that assembles the local voice agent so bots stay short.

transport.input() → Silero VAD → NemotronSTTService → user context aggregator → LLM → TTS → transport.output()
→ assistant context aggregator, with a :class:`~pipecat_nemotron.observers.metrics.VoiceLatencyObserver` attached.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loguru import logger
from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.audio.vad.vad_analyzer import VADParams
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    Frame,
    InterruptionFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
)
from pipecat.observers.base_observer import BaseObserver
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import (
    LLMContextAggregatorPair,
    LLMUserAggregatorParams,
)
from pipecat.processors.audio.vad_processor import VADProcessor
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.processors.frameworks.rtvi.frames import RTVIServerMessageFrame
from pipecat.services.llm_service import LLMService
from pipecat.services.stt_service import STTService
from pipecat.services.tts_service import TTSService
from pipecat.transports.base_transport import BaseTransport

from pipecat_nemotron.agent.turn_end import (
    TURN_END_MODES,
    TextTurnCommit,
    TurnEndLog,
    TurnEndMode,
    turn_commit_for,
    user_turn_strategies_for,
    validate_turn_end,
)
from pipecat_nemotron.asr.config import EngineConfig, validate_latency_ms
from pipecat_nemotron.llm.env import ENV_BACKEND, ENV_BASE_URL, ENV_NVIDIA_API_KEY, ENV_PREFIX
from pipecat_nemotron.observers.metrics import TurnLatency, VoiceLatencyObserver
from pipecat_nemotron.stt.base import VAD_STOP_SECS
from pipecat_nemotron.stt.eager import DEFAULT_EAGER_SILENCE_MS, EagerSettings

#: ``type`` of the RTVI ``server-message`` carrying one :class:`~pipecat_nemotron.observers.metrics.TurnLatency` record.
TURN_LATENCY_MESSAGE = "nemotron-turn-latency"

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
            VAD stop) or ``"text"`` (the final's words with Smart Turn, :mod:`pipecat_nemotron.agent.turn_end`).
            None: ``"smart"`` with the eager end of turn off (Pipecat's default), ``"vad"`` with it on.
        llm_configured: Whether an LLM endpoint was configured (``NEMOTRON_LLM_BASE_URL`` or ``_BACKEND``).
        llm_env: The environment the LLM settings are read from (see ``NemotronLLMSettings.from_env``).
        tts_model: Magpie model id or ``.nemo`` path to run in process (None: none).
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
    llm_env: Mapping[str, str] = field(default_factory=dict)
    tts_model: str | None = None
    tts_voice: str = "aria"
    tts_nim_server: str | None = None
    tts_nim_voice: str = "Magpie-Multilingual.EN-US.Aria"

    def __post_init__(self) -> None:
        validate_latency_ms(self.asr_latency_ms)
        if self.turn_end is not None:
            validate_turn_end(self.turn_end)
        if not self.asr_eager_silence_ms > 0:
            raise ValueError(f"asr_eager_silence_ms must be > 0 (ms), got {self.asr_eager_silence_ms!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> AgentSettings:
        """Read the agent's settings from ``environ`` (pass ``os.environ`` after ``load_env_file()``).

        Keys: ``NEMOTRON_ASR_MODEL``/``_DEVICE``/``_LATENCY_MS``/``_LANGUAGE``, ``NEMOTRON_ASR_EAGER_END_OF_TURN`` (``1``/``true``
        to turn it on) and ``NEMOTRON_ASR_EAGER_SILENCE_MS``, ``NEMOTRON_CPU_THREADS`` (torch threads of the ASR
        model on CPU), ``NEMOTRON_ASR_FINAL_TIMEOUT_S`` (seconds), ``NEMOTRON_ASR_BOOST_PHRASES`` (phrases separated
        by commas: ``Okafor, Zyrtec, Dr. Mbeki``), ``NEMOTRON_TURN_END`` (``smart``, ``vad``,
        ``text``), ``NEMOTRON_LLM_*`` (see ``docs/LLM.md``),
        ``MAGPIE_TTS_MODEL``/``_VOICE``, ``MAGPIE_NIM_SERVER``/``_VOICE``. Empty values count as unset.

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
            llm_configured=bool(get(ENV_BASE_URL) or get(ENV_BACKEND)),
            llm_env=llm_keys,
            tts_model=get("MAGPIE_TTS_MODEL"),
            tts_voice=get("MAGPIE_TTS_VOICE") or "aria",
            tts_nim_server=get("MAGPIE_NIM_SERVER"),
            tts_nim_voice=get("MAGPIE_NIM_VOICE") or "Magpie-Multilingual.EN-US.Aria",
        )

    def asr_engine_config(self) -> EngineConfig:
        """The ASR engine these settings name (the key services and :meth:`preload` share it under)."""
        from pipecat_nemotron.models import default_asr_model

        return EngineConfig(
            model=self.asr_model or default_asr_model(self.asr_device),
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
            from pipecat_nemotron.tts.service import MagpieTTSService

            return MagpieTTSService(
                model=self.tts_model,
                device=self.asr_device,
                settings=MagpieTTSService.Settings(voice=self.tts_voice),
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
        if self.llm_configured:
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
        else:
            lines.append(
                "TTS: not configured (set MAGPIE_TTS_MODEL or MAGPIE_NIM_SERVER in .env) — no speech"
            )
        return lines


class SimulatedPlayback(FrameProcessor):
    """Stands in for an output transport when there is no speaker (file demo, tests).

    Emits ``BotStartedSpeakingFrame`` (both directions) at the first TTS audio of a response and
    ``BotStoppedSpeakingFrame`` at its ``TTSStoppedFrame`` or an interruption, the way an output transport does,
    so voice-to-voice latency is measured. Audio is counted, not played.
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.speaking = False
        self.audio_seconds = 0.0

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """Track TTS audio and emit bot speaking frames."""
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            self.audio_seconds += len(frame.audio) / (2 * frame.num_channels * frame.sample_rate)
            if not self.speaking:
                self.speaking = True
                await self.broadcast_frame(BotStartedSpeakingFrame)
        elif isinstance(frame, (TTSStoppedFrame, InterruptionFrame)) and self.speaking:
            self.speaking = False
            await self.broadcast_frame(BotStoppedSpeakingFrame)
        await self.push_frame(frame, direction)


@dataclass
class VoiceAgent:
    """What :func:`build_voice_agent` assembled.

    Attributes:
        pipeline: The pipeline.
        worker: A ``PipelineWorker`` running it with metrics enabled and the observer attached.
        observer: The latency observer (per-turn records, JSONL, summary).
        context: The LLM context (None without an LLM).
        stt: The STT service.
        turn_end_log: Each turn-end decision (with ``turn_end`` set; None otherwise).

    """

    pipeline: Pipeline
    worker: PipelineWorker
    observer: VoiceLatencyObserver
    context: LLMContext | None
    stt: STTService
    processors: list[FrameProcessor] = field(default_factory=list)
    turn_end_log: TurnEndLog | None = None


def build_voice_agent(
    *,
    stt: STTService,
    llm: LLMService | None = None,
    tts: TTSService | None = None,
    transport: BaseTransport | None = None,
    input_processor: FrameProcessor | None = None,
    output_processor: FrameProcessor | None = None,
    after_stt: Sequence[FrameProcessor] = (),
    vad_stop_secs: float = VAD_STOP_SECS,
    turns_jsonl: str | Path | None = None,
    observers: Sequence[BaseObserver] = (),
    pipeline_params: PipelineParams | None = None,
    idle_timeout_secs: float | None = 300.0,
    turn_end: TurnEndMode | None = None,
) -> VoiceAgent:
    """Assemble the agent pipeline and its worker.

    Args:
        stt: Usually a :class:`~pipecat_nemotron.stt.NemotronSTTService`.
        llm: E.g. :func:`~pipecat_nemotron.llm.service.create_nemotron_llm`; None for a transcription-only pipeline.
        tts: E.g. :class:`~pipecat_nemotron.tts.service.MagpieTTSService` or Pipecat's ``NvidiaTTSService``; None to
            stop after the LLM.
        transport: Supplies ``input()``/``output()`` (Daily, SmallWebRTC, local audio...).
        input_processor: Used instead of ``transport.input()`` (None with no transport: frames are queued on
            the worker, e.g. by :func:`~pipecat_nemotron.agent.wav_input.feed_wav`).
        output_processor: Used instead of ``transport.output()``; with neither, a :class:`SimulatedPlayback`.
        after_stt: Extra processors placed right after the STT (e.g. a transcript printer).
        vad_stop_secs: Silence that ends a user turn, seconds.
        turns_jsonl: Where the observer appends one JSON line per turn.
        observers: More observers for the worker.
        pipeline_params: Defaults to ``PipelineParams(enable_metrics=True, enable_usage_metrics=True)``.
        idle_timeout_secs: Worker idle timeout, seconds (None: never).
        turn_end: How a VAD stop ends the user's turn (``"smart"``, ``"vad"``, ``"text"``; see
            :mod:`pipecat_nemotron.agent.turn_end`); None: Pipecat's default (Smart Turn), or the STT's own commit
            when it owns turn detection (eager end of turn). With the eager end of turn on, the STT decides:
            build it with ``eager=EagerSettings(turn_commit=turn_commit_for(turn_end))``
            (``AgentSettings.create_stt`` does).
            Each decision goes to :attr:`VoiceAgent.turn_end_log` and the turn's latency message.

    Raises:
        ValueError: ``tts`` without ``llm`` (nothing would produce text to speak), or a ``turn_end`` the STT was
            not built for.

    """
    if tts is not None and llm is None:
        raise ValueError(
            "tts needs an llm to speak its replies; pass llm=create_nemotron_llm(...) or drop tts"
        )
    turn_end_log, user_params = _turn_end_setup(stt, turn_end)
    source = input_processor or (transport.input() if transport is not None else None)
    sink = output_processor or (transport.output() if transport is not None else SimulatedPlayback())
    vad = VADProcessor(vad_analyzer=SileroVADAnalyzer(params=VADParams(stop_secs=vad_stop_secs)))
    head = [p for p in (source, vad, stt) if p is not None] + list(after_stt)
    has_output = transport is not None or output_processor is not None
    processors, context = _pipeline_processors(head, llm, tts, sink, has_output, user_params)
    pipeline = Pipeline(processors)
    observer = VoiceLatencyObserver(jsonl_path=turns_jsonl)
    worker = PipelineWorker(
        pipeline,
        params=pipeline_params or PipelineParams(enable_metrics=True, enable_usage_metrics=True),
        observers=[observer, *observers],
        idle_timeout_secs=idle_timeout_secs,
        cancel_on_idle_timeout=idle_timeout_secs is not None,
    )
    if transport is not None:

        @observer.event_handler("on_turn_latency")
        async def _send_turn_latency(_observer: VoiceLatencyObserver, turn: TurnLatency) -> None:
            # RTVI clients (the /nemotron page) show each turn's latency as the bot measured it.
            data = {"type": TURN_LATENCY_MESSAGE, **turn.to_dict()}
            decision = turn_end_log.last_commit if turn_end_log is not None else None
            if decision is not None:
                data["turn_end"] = decision.to_dict()
            await worker.queue_frame(RTVIServerMessageFrame(data=data))

    return VoiceAgent(pipeline, worker, observer, context, stt, processors, turn_end_log)


def _pipeline_processors(
    head: list[FrameProcessor],
    llm: LLMService | None,
    tts: TTSService | None,
    sink: FrameProcessor,
    has_output: bool,
    user_params: LLMUserAggregatorParams | None,
) -> tuple[list[FrameProcessor], LLMContext | None]:
    """The processors after the input, VAD and STT (``head``): the LLM's context aggregators, LLM, TTS, output."""
    processors = list(head)
    if llm is None:
        # Transcription only: the output transport still carries RTVI messages (bot-ready, interim and final
        # transcripts, metrics) to the client; without it a browser sees nothing.
        return processors + ([sink] if has_output else []), None
    context = LLMContext()
    aggregators = LLMContextAggregatorPair(context, user_params=user_params)
    processors += [aggregators.user(), llm]
    if tts is not None:
        processors.append(tts)
    return processors + [sink, aggregators.assistant()], context


def _turn_end_setup(
    stt: STTService, turn_end: TurnEndMode | None
) -> tuple[TurnEndLog | None, LLMUserAggregatorParams | None]:
    """The decision log and the user aggregator's parameters for ``turn_end`` (see :func:`build_voice_agent`)."""
    commit = getattr(stt, "turn_commit", None)
    if getattr(stt, "eager_end_of_turn_enabled", False):
        # The STT owns turn detection (Pipecat's external strategies): its commit decides.
        if isinstance(commit, TextTurnCommit):
            if turn_end is not None and commit.mode != turn_end:
                raise ValueError(
                    f"turn_end={turn_end!r} but the STT's EagerSettings.turn_commit is {commit.mode!r}; build the STT "
                    f"with eager=EagerSettings(turn_commit=turn_commit_for({turn_end!r}))"
                )
            commit.log = commit.log or TurnEndLog()
            return commit.log, None
        if turn_end is not None:
            raise ValueError(
                f"with the eager end of turn on the STT decides the turn end: build it with "
                f"eager=EagerSettings(turn_commit=turn_commit_for({turn_end!r})) (AgentSettings(turn_end=...).create_stt() "
                "does)"
            )
        return None, None
    if turn_end is None:
        return None, None
    log = TurnEndLog()
    return log, LLMUserAggregatorParams(user_turn_strategies=user_turn_strategies_for(turn_end, log=log))
