"""Per-turn voice latency: what each stage cost, one record per user turn.

:class:`VoiceLatencyObserver` builds on Pipecat's
:class:`~pipecat.observers.user_bot_latency_observer.UserBotLatencyObserver`, which
already times a user turn (voice-to-voice) and collects the services' TTFB metrics
and a named breakdown of the interval. This module only sorts those numbers by
stage, adds the one number Pipecat has no metric for (pure ASR finalize time), and
keeps, writes and summarises them.

Where each value comes from (all need ``PipelineParams(enable_metrics=True)``):

====================  =====================================================================
Stage                 Source
====================  =====================================================================
``v2v_ms``            ``UserBotLatencyObserver``'s ``on_latency_measured``: from speech end
                      (``VADUserStoppedSpeakingFrame.timestamp - stop_secs``) to
                      ``BotStartedSpeakingFrame``. Pipecat's definition.
``ttfs_ms``           The STT service's ``TTFBMetricsData`` (Pipecat's STT "TTFB" *is*
                      time-to-final-segment: ``STTService`` starts it at speech end on
                      ``VADUserStoppedSpeakingFrame`` and stops it when it pushes the
                      ``TranscriptionFrame`` after ``request_finalize()`` /
                      ``confirm_finalize()``), taken from the breakdown's ``ttfb`` list.
``asr_finalize_ms``   :class:`ASRFinalizeMetricsData` in a ``MetricsFrame`` pushed by the
                      STT service (build it with :func:`asr_finalize_metrics_frame`): the
                      model time to flush the right context and decode the last chunk,
                      excluding the VAD wait and frame hops. Part of ``ttfs_ms``.
``llm_ttfb_ms``       The LLM service's ``TTFBMetricsData``: request sent to first streamed
                      token (content or reasoning).
``tts_ttfb_ms``       The TTS service's ``TTFBMetricsData``: text sent to first audio.
``eager_*``           The eager end of turn's frames: ``EagerTranscriptionFrame`` (a
                      prediction, which starts an LLM request), ``EagerEndOfTurnCancelFrame``
                      (it was withdrawn or did not match) and the finalized
                      ``TranscriptionFrame`` (the commit: the lead time ends there).
====================  =====================================================================

A TTFB is assigned to a stage by the type of the processor that pushed it
(``STTService`` / ``LLMService`` / ``TTSService``), falling back to its name
(``STT``/``ASR``, ``LLM``, ``TTS``) or an explicit ``processor_stages`` map. A stage
that did not report in a turn is ``None``.

Example::

    observer = VoiceLatencyObserver(jsonl_path="turns.jsonl")
    worker = PipelineWorker(pipeline, params=PipelineParams(enable_metrics=True),
                            observers=[observer])
    ...
    stats = observer.summary()  # also logged at EndFrame/CancelFrame

Then ``python -m pipecat_nemotron.observers.report turns.jsonl -o latency.png``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from loguru import logger
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    CancelFrame,
    EagerEndOfTurnCancelFrame,
    EagerTranscriptionFrame,
    EndFrame,
    Frame,
    LLMFullResponseStartFrame,
    MetricsFrame,
    TranscriptionFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.metrics.metrics import TTFBMetricsData
from pipecat.observers.base_observer import FramePushed
from pipecat.observers.user_bot_latency_observer import LatencyBreakdown, UserBotLatencyObserver
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.llm_service import LLMService
from pipecat.services.stt_service import STTService
from pipecat.services.tts_service import TTSService

from pipecat_nemotron.observers import latency_stats

# The records and statistics live in ``latency_stats`` (plain Python); they are re-exported here, where the
# observer that builds them is (the way ``asyncio`` re-exports its submodules).
from pipecat_nemotron.observers.latency_stats import *  # noqa: F403
from pipecat_nemotron.observers.latency_stats import (
    StageStats,
    TurnLatency,
    format_eager,
    format_summary,
    summarize,
    summarize_eager,
)
from pipecat_nemotron.stt.metrics import (
    ASR_FINALIZE_METRIC,
    ASRFinalizeMetricsData,
    asr_finalize_metrics_frame,
    is_asr_finalize_metric,
)

__all__ = [
    "ASR_FINALIZE_METRIC",
    "ASRFinalizeMetricsData",
    "VoiceLatencyObserver",
    "asr_finalize_metrics_frame",
    "is_asr_finalize_metric",
]
__all__ += latency_stats.__all__


# --- the observer ---------------------------------------------------------------------


_STAGE_TOKENS = re.compile(r"STT|TTS|ASR|LLM")
_TOKEN_STAGES = {"STT": "stt", "ASR": "stt", "TTS": "tts", "LLM": "llm"}


def _stage_from_name(name: str) -> str | None:
    """Guess a stage from a processor name: the first STT/ASR/TTS/LLM token, left to right.

    Scanning left to right keeps ``NemotronSTTService`` (whose ``STTS`` also holds
    ``TTS``) an STT; the case-sensitive pass keeps ``ElevenLabsTTSService`` a TTS.
    """
    for candidate in (name, name.upper()):
        match = _STAGE_TOKENS.search(candidate)
        if match:
            return _TOKEN_STAGES[match.group(0)]
    return None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


class _EagerTurn:
    """The eager end of turn's predictions in the user turn being watched."""

    def __init__(self) -> None:
        self.predictions = 0
        self.cancelled = 0
        self.standing_since: float | None = None  # when the prediction not (yet) cancelled was made
        self.lead_ms: float | None = None
        self._seen: set[int] = set()  # frame ids: the observer sees a frame at every hop

    def observe(self, frame: Frame, now: float) -> bool:
        """Take an eager frame or a committed transcript; False for any frame the rest of the observer wants."""
        if isinstance(frame, EagerTranscriptionFrame):
            if frame.id not in self._seen:
                self._seen.add(frame.id)
                self.predictions += 1
                self.standing_since = now
                self.lead_ms = None
            return True
        if isinstance(frame, EagerEndOfTurnCancelFrame):
            if self.standing_since is not None:
                self.cancelled += 1
                self.standing_since = None
                self.lead_ms = None
            return True
        if isinstance(frame, TranscriptionFrame) and frame.finalized:
            if self.standing_since is not None and self.lead_ms is None:
                self.lead_ms = _ms(now - self.standing_since)
        return False

    def record(self, turn: TurnLatency) -> None:
        """Write the turn's eager fields."""
        turn.eager = self.predictions > 0
        turn.eager_predictions = self.predictions
        turn.eager_cancelled = self.cancelled
        if self.predictions:
            turn.eager_outcome = "kept" if self.standing_since is not None else "cancelled"
            turn.eager_lead_ms = self.lead_ms


class VoiceLatencyObserver(UserBotLatencyObserver):
    """Records STT/ASR/LLM/TTS/voice-to-voice latency per user turn.

    A :class:`~pipecat.observers.user_bot_latency_observer.UserBotLatencyObserver`
    (so its ``on_latency_measured``/``on_latency_breakdown`` events and breakdown
    logic are unchanged) that turns each measured turn into a :class:`TurnLatency`:
    appended to :attr:`turns`, written as one JSON line to ``jsonl_path`` (appended),
    logged as one INFO line (no transcript text; that is logged at DEBUG only), and
    emitted as ``on_turn_latency(observer, turn)``. At ``EndFrame``/``CancelFrame``
    (or pipeline cleanup) it logs p50/p90/p99 per stage once; :meth:`summary`
    returns them at any time.

    Only turns the bot answered are recorded (a turn ends at
    ``BotStartedSpeakingFrame``); the greeting before the first user turn is not.
    Metrics need ``PipelineParams(enable_metrics=True)``.

    Events:
        on_turn_latency(observer, turn): A :class:`TurnLatency` was recorded.
    """

    def __init__(
        self,
        *,
        jsonl_path: str | Path | None = None,
        record_text: bool = False,
        processor_stages: Mapping[str, str] | None = None,
        log_turns: bool = True,
        time_source: Callable[[], float] = time.time,
        **kwargs: Any,
    ) -> None:
        """Create the observer.

        Args:
            jsonl_path: File to append one JSON line per turn to (parent folders are
                created), or None to keep records in memory only.
            record_text: Whether the JSON records include the user's transcript.
            processor_stages: Explicit processor name to stage (``"stt"``, ``"llm"``
                or ``"tts"``) for services the type and name rules do not classify.
            log_turns: Whether to log one INFO line per turn.
            time_source: Clock in Unix seconds (shared with the parent observer);
                tests may pass a fake one.
            **kwargs: Passed to ``UserBotLatencyObserver``.

        Raises:
            ValueError: If ``processor_stages`` maps to an unknown stage.

        """
        super().__init__(time_source=time_source, **kwargs)
        self._jsonl_path = Path(jsonl_path) if jsonl_path is not None else None
        self._record_text = record_text
        self._log_turns = log_turns
        self._stages_by_processor: dict[str, str] = {}
        for name, stage in (processor_stages or {}).items():
            if stage not in ("stt", "llm", "tts"):
                raise ValueError(f"processor_stages[{name!r}] = {stage!r}: use 'stt', 'llm' or 'tts'")
        self._explicit_stages = dict(processor_stages or {})
        self._turns: list[TurnLatency] = []
        self._summary_logged = False

        # The user cycle being watched (mirrors the parent's, which is private).
        self._vad_stop_ts: float | None = None
        self._vad_stop_secs: float | None = None
        self._finalize_ms: float | None = None
        self._transcript_ts: float | None = None
        self._llm_requested = False
        self._texts: list[str] = []
        self._bot_started_ts: float | None = None
        self._pending_v2v: float | None = None
        self._eager = _EagerTurn()

        self._register_event_handler("on_turn_latency")

    # --- public ---------------------------------------------------------------------

    @property
    def turns(self) -> list[TurnLatency]:
        """Records of the turns measured so far (a copy)."""
        return list(self._turns)

    def summary(self, *, log: bool = True) -> dict[str, StageStats]:
        """p50/p90/p99 per stage over the turns so far.

        Args:
            log: Whether to log the table at INFO.

        Returns:
            Stage name to :class:`StageStats` (ms).

        """
        stats = summarize(self._turns)
        if log:
            eager = summarize_eager(self._turns)
            extra = f"\n{format_eager(eager)}" if eager.predictions else ""
            logger.info(f"{self}: latency over {len(self._turns)} turn(s)\n{format_summary(stats)}{extra}")
        return stats

    # --- frame hooks ------------------------------------------------------------------

    async def on_push_frame(self, data: FramePushed) -> None:
        """Track the user cycle, then let the parent measure (which may emit a turn).

        Args:
            data: The frame push event.

        """
        if data.direction == FrameDirection.DOWNSTREAM and not self._eager.observe(data.frame, self._now()):
            self._track(data)
        await super().on_push_frame(data)
        if data.direction == FrameDirection.DOWNSTREAM and isinstance(data.frame, (EndFrame, CancelFrame)):
            self._log_summary_once()

    async def cleanup(self) -> None:
        """Log the session summary if no EndFrame/CancelFrame was observed."""
        self._log_summary_once()
        await super().cleanup()

    def _track(self, data: FramePushed) -> None:
        frame = data.frame
        if isinstance(frame, VADUserStartedSpeakingFrame):
            # Same reset as the parent: a new VAD segment restarts the measurement.
            self._vad_stop_ts = None
            self._vad_stop_secs = None
            self._finalize_ms = None
            self._transcript_ts = None
            self._llm_requested = False
        elif isinstance(frame, VADUserStoppedSpeakingFrame):
            self._vad_stop_ts = frame.timestamp
            self._vad_stop_secs = frame.stop_secs
            self._llm_requested = False
        elif isinstance(frame, TranscriptionFrame):
            if frame.text:
                self._texts.append(frame.text)
            if not self._llm_requested:
                self._transcript_ts = self._now()
        elif isinstance(frame, LLMFullResponseStartFrame):
            self._llm_requested = True
        elif isinstance(frame, MetricsFrame):
            for metrics in frame.data:
                if is_asr_finalize_metric(metrics):
                    self._finalize_ms = _ms(metrics.value)
                elif isinstance(metrics, TTFBMetricsData):
                    self._learn_stage(metrics.processor, data.source)
        elif isinstance(frame, BotStartedSpeakingFrame):
            self._bot_started_ts = self._now()

    def _learn_stage(self, processor: str, source: object) -> None:
        if processor in self._stages_by_processor:
            return
        stage: str | None = None
        if isinstance(source, STTService):
            stage = "stt"
        elif isinstance(source, LLMService):
            stage = "llm"
        elif isinstance(source, TTSService):
            stage = "tts"
        if stage is not None:
            self._stages_by_processor[processor] = stage

    def _stage_of(self, processor: str) -> str | None:
        return (
            self._explicit_stages.get(processor)
            or self._stages_by_processor.get(processor)
            or _stage_from_name(processor)
        )

    # --- the parent's events, handled inline so a turn is recorded deterministically --

    async def _call_event_handler(self, event_name: str, *args: Any, **kwargs: Any) -> None:
        if event_name == "on_latency_measured" and args:
            self._pending_v2v = float(args[0])
        elif event_name == "on_latency_breakdown" and args:
            turn = self._close_turn(args[0])
            await super()._call_event_handler(event_name, *args, **kwargs)
            if turn is not None:
                await super()._call_event_handler("on_turn_latency", turn)
            return
        await super()._call_event_handler(event_name, *args, **kwargs)

    def _close_turn(self, breakdown: LatencyBreakdown) -> TurnLatency | None:
        v2v, self._pending_v2v = self._pending_v2v, None
        if v2v is None:
            # The greeting (measured from client connect), not a user turn.
            return None

        first: dict[str, tuple[str, float]] = {}
        for ttfb in breakdown.ttfb:
            stage = self._stage_of(ttfb.processor)
            if stage is not None and stage not in first:
                first[stage] = (ttfb.processor, ttfb.duration_secs)

        contributions: dict[str, float] = {}
        for c in breakdown.contributions:
            contributions[c.key] = round(contributions.get(c.key, 0.0) + c.duration_secs * 1000.0, 3)

        turn = TurnLatency(
            turn=len(self._turns) + 1,
            speech_end_ts=breakdown.user_turn_start_time,
            vad_stop_ts=self._vad_stop_ts,
            vad_stop_secs=self._vad_stop_secs,
            transcript_ts=self._transcript_ts,
            bot_started_ts=self._bot_started_ts,
            ttfs_ms=_ms(first["stt"][1]) if "stt" in first else None,
            asr_finalize_ms=self._finalize_ms,
            llm_ttfb_ms=_ms(first["llm"][1]) if "llm" in first else None,
            tts_ttfb_ms=_ms(first["tts"][1]) if "tts" in first else None,
            v2v_ms=_ms(v2v),
            breakdown_ms=contributions,
            processors={stage: name for stage, (name, _) in first.items()},
            transcript=" ".join(self._texts) if self._record_text and self._texts else None,
        )
        self._eager.record(turn)
        self._eager = _EagerTurn()
        text = " ".join(self._texts)
        self._texts = []
        self._finalize_ms = None
        self._turns.append(turn)
        self._write(turn)
        if self._log_turns:
            logger.info(self._turn_line(turn))
        if text:
            logger.debug(f"{self}: turn {turn.turn} transcript: {text!r}")
        return turn

    def _write(self, turn: TurnLatency) -> None:
        if self._jsonl_path is None:
            return
        try:
            self._jsonl_path.parent.mkdir(parents=True, exist_ok=True)
            with self._jsonl_path.open("a", encoding="utf-8") as f:
                f.write(turn.to_json() + "\n")
        except OSError as e:
            logger.error(f"{self}: cannot write turn latency to {self._jsonl_path}: {e}")

    @staticmethod
    def _turn_line(turn: TurnLatency) -> str:
        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value:.0f}"

        eager = ""
        if turn.eager:
            eager = f" | eager {turn.eager_outcome} (lead {ms(turn.eager_lead_ms)} ms, {turn.eager_cancelled} cancelled)"
        return (
            f"turn {turn.turn}: v2v {ms(turn.v2v_ms)} ms | STT TTFS {ms(turn.ttfs_ms)} "
            f"(ASR finalize {ms(turn.asr_finalize_ms)}) | LLM TTFB {ms(turn.llm_ttfb_ms)} | "
            f"TTS TTFB {ms(turn.tts_ttfb_ms)} ms{eager}"
        )

    def _log_summary_once(self) -> None:
        if self._summary_logged:
            return
        self._summary_logged = True
        if self._turns:
            self.summary(log=True)
