"""One function that assembles the local voice agent so bots stay short.

transport.input() → Silero VAD → NemotronSTTService → user context aggregator → LLM → TTS → transport.output()
→ assistant context aggregator, with a :class:`~pipecat_nemotron.observers.metrics.VoiceLatencyObserver` attached.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

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

from pipecat_nemotron.agent.settings import AgentSettings
from pipecat_nemotron.agent.turn_end import (
    EOU_TURN_END_MODES,
    EouTurnCommit,
    TextTurnCommit,
    TurnEndLog,
    TurnEndMode,
    user_turn_strategies_for,
)
from pipecat_nemotron.observers.metrics import TurnLatency, VoiceLatencyObserver
from pipecat_nemotron.stt.base import VAD_STOP_SECS

__all__ = [
    "TURN_LATENCY_MESSAGE",
    "AgentSettings",
    "SimulatedPlayback",
    "VoiceAgent",
    "build_voice_agent",
]

#: ``type`` of the RTVI ``server-message`` carrying one :class:`~pipecat_nemotron.observers.metrics.TurnLatency` record.
TURN_LATENCY_MESSAGE = "nemotron-turn-latency"

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
        turn_end: How a VAD stop ends the user's turn (``"smart"``, ``"vad"``, ``"text"``, ``"eou"``, ``"eou_smart"``; see
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
    if isinstance(commit, EouTurnCommit) and getattr(stt, "owns_turn_detection", False):
        # An EOU commit without predictions: the STT still owns turn detection, Pipecat follows its frames.
        if turn_end is not None and commit.mode != turn_end:
            raise ValueError(
                f"turn_end={turn_end!r} but the STT's turn_commit is {commit.mode!r}; build the STT with "
                f"turn_commit=turn_commit_for({turn_end!r})"
            )
        commit.log = commit.log or TurnEndLog()
        return commit.log, LLMUserAggregatorParams(user_turn_strategies=user_turn_strategies_for(commit.mode))
    if turn_end in EOU_TURN_END_MODES:
        raise ValueError(
            f"turn_end={turn_end!r} ends turns on the STT's end-of-utterance events: build the STT with "
            f"turn_commit=turn_commit_for({turn_end!r}) and a model that emits <EOU> "
            "(AgentSettings(turn_end=...).create_stt() does)"
        )
    if turn_end is None:
        return None, None
    log = TurnEndLog()
    return log, LLMUserAggregatorParams(user_turn_strategies=user_turn_strategies_for(turn_end, log=log))
