"""The end-of-turn modes on Pipecat's turn machinery: a user turn stop strategy, and the STT's eager-mode commit.

Two places decide when a VAD stop ends the user's turn, and both apply :func:`~pipecat_nemotron.agent.turn_end.decide`:

- :class:`TranscriptTurnStopStrategy`, a Pipecat ``TurnAnalyzerUserTurnStopStrategy`` in the user aggregator
  (the eager end of turn off). It reads the turn's words when the finalized transcript arrives; a complete
  sentence commits then, without waiting for the analyzer's inference (Smart Turn v3: ~100 ms on a CPU core),
  and otherwise it waits, as Pipecat's does, for the analyzer's verdict.
- :class:`TextTurnCommit`, the STT's :class:`~pipecat_nemotron.stt.eager.TurnCommit` when the STT owns turn detection
  (the eager end of turn on). It also gates the eager predictions: in ``"text"`` mode a pause predicts the end of
  the turn only when the words so far are a complete sentence, the same evidence that commits it at the VAD stop.
- :class:`EouTurnCommit` (``"eou"``, ``"eou_smart"``): the recogniser's own ``<EOU>`` ends the turn. The STT owns
  turn detection in these modes whether the eager end of turn is on or off (Pipecat's
  ``ExternalUserTurnStrategies`` follow its ``ProposedUserStarted/StoppedSpeakingFrame``). The final of a VAD stop
  commits when the model emitted ``<EOU>`` after the turn's last words; otherwise the turn is held until an
  ``<EOU>`` comes, the user speaks again, or (``"eou_smart"``) Smart Turn calls it complete. The STT finalizes the
  utterance on the ``<EOU>``, not at the VAD stop: a final's flush pads the audio with silence the user never
  made, in which a model says ``<EOU>`` at a pause inside a sentence. The eager predictions wait for the
  ``<EOU>`` too.

A turn held open by the words ends when the user speaks again (the turn goes on) or after the analyzer's fallback
silence (Smart Turn's ``stop_secs``, 3 s, counted from the speech end): every hold has an end.
"""

from __future__ import annotations

import asyncio

from loguru import logger
from pipecat.audio.turn.base_turn_analyzer import BaseTurnAnalyzer
from pipecat.frames.frames import InputAudioRawFrame, TranscriptionFrame, VADUserStoppedSpeakingFrame
from pipecat.turns.user_turn_strategies import ExternalUserTurnStrategies, UserTurnStrategies

from pipecat_nemotron.agent.turn_end.decision import (
    EOU_TURN_END_MODES,
    TurnEndDecision,
    TurnEndLog,
    TurnEndMode,
    VADStopAnalyzer,
    decide,
    validate_turn_end,
)
from pipecat_nemotron.agent.turn_end.rules import TextVerdict, rules_for
from pipecat_nemotron.stt.eager import TurnCommit

from pipecat.turns.user_stop import TurnAnalyzerUserTurnStopStrategy  # isort: skip

__all__ = [
    "DEFAULT_EOU_WAIT_S",
    "DEFAULT_HOLD_SECS",
    "EouTurnCommit",
    "TextTurnCommit",
    "TranscriptTurnStopStrategy",
    "smart_turn_analyzer",
    "turn_commit_for",
    "user_turn_strategies_for",
]

#: Silence that ends a turn held open, from the speech end, s, when the analyzer names none (Smart Turn's own).
DEFAULT_HOLD_SECS = 3.0
#: How long after a VAD stop the STT of an :class:`EouTurnCommit` keeps listening for the model's ``<EOU>`` before
#: it finalizes the utterance, s. It must outlast a pause inside a sentence: the VAD stops 200 ms into the pause and
#: starts again 200 ms (its ``start_secs``) into the speech after it, so a 900 ms pause (``bench turns``' longest)
#: keeps the wait open ~0.9 s. Most turns do not wait that long: the tiny EOU model's ``<EOU>`` comes 150-330 ms
#: (audio) after the last word, ~0.3 s after a 200 ms VAD stop in wall time (docs/TINY_MODEL.md).
DEFAULT_EOU_WAIT_S = 1.5


def smart_turn_analyzer() -> BaseTurnAnalyzer:
    """Pipecat's default turn analyzer (Smart Turn v3, local ONNX, bundled with Pipecat)."""
    from pipecat.audio.turn.smart_turn.local_smart_turn_v3 import LocalSmartTurnAnalyzerV3

    return LocalSmartTurnAnalyzerV3()


def _hold_secs(analyzer: BaseTurnAnalyzer) -> float:
    return float(getattr(analyzer.params, "stop_secs", DEFAULT_HOLD_SECS) or DEFAULT_HOLD_SECS)


def _log_decision(owner: object, decision: TurnEndDecision, log: TurnEndLog | None) -> None:
    logger.debug(f"{owner}: turn end {'committed' if decision.commit else 'held'} by {decision.by}: {decision}")
    if log is not None:
        log.add(decision)


class TranscriptTurnStopStrategy(TurnAnalyzerUserTurnStopStrategy):
    """Pipecat's turn-analyzer stop strategy, reading the turn's final words too (``read_text``).

    Args:
        turn_analyzer: Smart Turn (``"smart"``/``"text"``) or :class:`VADStopAnalyzer` (``"vad"``).
        read_text: Apply the transcript rules (``"text"`` mode); False keeps the analyzer's decision.
        language: Rules used when a transcript names no language (``"en"``, ``"es"``).
        log: Where each decision is recorded.
        **kwargs: Passed to ``TurnAnalyzerUserTurnStopStrategy``.

    """

    def __init__(
        self,
        *,
        turn_analyzer: BaseTurnAnalyzer,
        read_text: bool = True,
        language: str = "en",
        log: TurnEndLog | None = None,
        **kwargs,
    ) -> None:
        super().__init__(turn_analyzer=turn_analyzer, **kwargs)
        self._read_text = read_text
        self._default_language = language
        self._log = log
        self._has_analyzer = not isinstance(turn_analyzer, VADStopAnalyzer)
        self._finals: list[str] = []
        self._language: object | None = None
        self._decision: TurnEndDecision | None = None
        self._hold_ms: float | None = None  # silence since the VAD stop while the words hold the turn
        self._analysis: asyncio.Task[None] | None = None  # the analyzer's verdict at the VAD stop, in flight
        self._analyzer_failed = False  # at this VAD stop: the VAD stop decides in its place

    async def _reset(self) -> None:
        self._finals = []
        await super()._reset()

    async def _discard_pending_end_of_turn(self) -> None:
        self._decision = None
        self._hold_ms = None
        self._analyzer_failed = False
        analysis, self._analysis = self._analysis, None
        if analysis is not None and analysis is not asyncio.current_task() and not analysis.done():
            await self.task_manager.cancel_task(analysis)  # a stale verdict must not land on the next turn
        await super()._discard_pending_end_of_turn()

    async def cleanup(self) -> None:
        """Stop an analysis in flight, then Pipecat's cleanup (the analyzer's)."""
        analysis, self._analysis = self._analysis, None
        if analysis is not None and not analysis.done():
            await self.task_manager.cancel_task(analysis)
        await super().cleanup()

    async def _handle_vad_user_stopped_speaking(self, frame: VADUserStoppedSpeakingFrame) -> None:
        if not (self._read_text and self._has_analyzer):
            await super()._handle_vad_user_stopped_speaking(frame)
            return
        # The analyzer runs beside the frames that follow, so that the final transcript, which arrives during
        # its inference, can commit a complete sentence at once; any other verdict of the words waits for it.
        self._vad_user_speaking = False  # the audio after the stop is silence to the analyzer meanwhile
        self._vad_stopped = True
        self._analysis = self.task_manager.create_task(self._analyze(frame), f"{self}::_analyze")

    async def _analyze(self, frame: VADUserStoppedSpeakingFrame) -> None:
        try:
            await super()._handle_vad_user_stopped_speaking(frame)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the turn must still end: without a verdict the VAD stop decides
            logger.error(f"{self}: turn analyzer failed at a VAD stop, the VAD stop decides: {e!r}")
            self._analyzer_failed = True
            self._turn_complete = True
            if self._timeout_task is None:  # Pipecat's wait for a transcript that never comes, as after a verdict
                self._timeout_task = self.task_manager.create_task(
                    self._timeout_handler(self._stt_timeout), f"{self}::_timeout_handler"
                )
            await self._maybe_trigger_user_turn_stopped()

    def _analysis_pending(self) -> bool:
        task = self._analysis
        return task is not None and not task.done() and task is not asyncio.current_task()

    async def _handle_transcription(self, frame: TranscriptionFrame) -> None:
        if frame.text:
            self._finals.append(frame.text)
            self._language = frame.language
        await super()._handle_transcription(frame)

    async def _handle_input_audio(self, frame: InputAudioRawFrame) -> None:
        await super()._handle_input_audio(frame)
        if self._hold_ms is None or self._vad_user_speaking:
            return
        self._hold_ms += 1000.0 * len(frame.audio) / (2 * frame.num_channels * frame.sample_rate)
        if self._hold_ms >= 1000.0 * max(_hold_secs(self._turn_analyzer) - self._stop_secs, 0.0):
            self._turn_complete = True  # the analyzer's fallback: the words held, the silence goes on
            await self._maybe_trigger_user_turn_stopped()

    async def _maybe_trigger_user_turn_stopped(self) -> None:
        if self._decision is None and self._vad_stopped and self._transcript_finalized and self._text:
            verdict = None
            if self._read_text:
                verdict = rules_for(self._language, self._default_language).verdict(" ".join(self._finals))
            if self._analysis_pending():
                if verdict is not TextVerdict.COMPLETE:
                    return  # the analyzer decides, or the words hold once its verdict is in
                self._decision = decide(verdict, None)
            else:
                analyzed = self._has_analyzer and not self._analyzer_failed
                self._decision = decide(verdict, self._turn_complete if analyzed else None)
            self._turn_complete = self._decision.commit
            if self._decision.by == "text" and not self._decision.commit:
                self._hold_ms = 0.0
            _log_decision(self, self._decision, self._log)
        elif self._decision is not None and not self._decision.commit and self._turn_complete:
            self._decision = TurnEndDecision(True, "timeout", self._decision.verdict, self._decision.smart_complete)
            self._hold_ms = None
            _log_decision(self, self._decision, self._log)
        await super()._maybe_trigger_user_turn_stopped()


class TextTurnCommit(TurnCommit):
    """The STT's commit at each VAD stop (eager end of turn on), by :func:`decide`, and its prediction gate.

    Args:
        analyzer: Smart Turn, or None (every VAD stop commits unless the words hold it).
        read_text: Apply the transcript rules (``"text"`` mode).
        language: Rules used when the STT names no language.
        log: Where each decision is recorded (``build_voice_agent`` sets one).
        vad_stop_secs: The VAD's ``stop_secs`` (silence already gone at a VAD stop), s.

    Attributes:
        mode: ``"text"``, ``"smart"`` (an analyzer, words not read) or ``"vad"``.
        log: Where each decision is recorded.

    """

    def __init__(
        self,
        analyzer: BaseTurnAnalyzer | None = None,
        *,
        read_text: bool = True,
        language: str = "en",
        log: TurnEndLog | None = None,
        vad_stop_secs: float = 0.2,
    ) -> None:
        super().__init__(analyzer)
        self._read_text = read_text
        self._default_language = language
        self.mode: TurnEndMode = "text" if read_text else ("smart" if analyzer is not None else "vad")
        self.log = log
        self._hold_limit_ms = 1000.0 * max(
            (_hold_secs(analyzer) if analyzer is not None else DEFAULT_HOLD_SECS) - vad_stop_secs, 0.0
        )
        self._texts: list[str] = []  # finals of the turn held open so far
        self._hold_ms: float | None = None
        self._last: TurnEndDecision | None = None
        self._sample_rate = 16000

    def start(self, sample_rate: int) -> None:
        """Set the analyzer's sample rate and this one's, Hz."""
        super().start(sample_rate)
        self._sample_rate = sample_rate

    def _verdict_of(self, text: str, language: object | None) -> TextVerdict | None:
        if not self._read_text:
            return None
        return rules_for(language, self._default_language).verdict(" ".join([*self._texts, text]))

    def holds_prediction(self, text: str, language: object | None = None) -> bool:
        """In ``"text"`` mode, a pause predicts the end of the turn only after a complete sentence."""
        return self._read_text and self._verdict_of(text, language) is not TextVerdict.COMPLETE

    def on_speech_start(self, start_secs: float) -> None:
        """The user speaks (again): a hold ends, the turn goes on."""
        super().on_speech_start(start_secs)
        self._hold_ms = None

    def on_audio(self, audio: bytes, speaking: bool) -> bool:
        """Feed the analyzer; True when a turn held open ends (the analyzer's or the hold's own fallback)."""
        ended = super().on_audio(audio, speaking)
        if not ended and self._hold_ms is not None and not speaking:
            self._hold_ms += 1000.0 * len(audio) / (2 * self._sample_rate)
            ended = self._hold_ms >= self._hold_limit_ms
        if ended:
            self._held = False
            self._hold_ms = None
            self._texts = []
            last = self._last or TurnEndDecision(False, "timeout")
            self._last = TurnEndDecision(True, "timeout", last.verdict, last.smart_complete)
            _log_decision(self, self._last, self.log)
        return ended

    async def complete(self, text: str = "", language: object | None = None) -> bool:
        """Whether the final now delivered commits the turn, by the words and the analyzer's verdict."""
        if not text and not self._texts:  # no speech (noise, the session's end): nothing to read or record
            return await super().complete(text, language)
        verdict = self._verdict_of(text, language)
        task, self._verdict = self._verdict, None
        smart: bool | None = None
        if task is not None:
            if verdict is TextVerdict.COMPLETE:
                task.add_done_callback(_ignore_result)  # the words decide; the analysis ends on its own
            else:
                smart = await task
        decision = decide(verdict, smart)
        self._last = decision
        self._held = not decision.commit
        self._hold_ms = 0.0 if self._held else None
        self._texts = [*self._texts, text] if self._held and text else []
        _log_decision(self, decision, self.log)
        return decision.commit


class EouTurnCommit(TextTurnCommit):
    """The STT's commit in the ``"eou"`` and ``"eou_smart"`` modes: the model's ``<EOU>`` ends the turn.

    The STT keeps listening after a VAD stop and finalizes the utterance when the model emits ``<EOU>`` in the
    audio it heard (:meth:`on_eou`, cleared by :meth:`on_words` and by speech), when the user speaks again (no
    final: the utterance goes on), or after ``eou_wait_s`` without one. A final's flush pads the audio with
    silence, in which a model says ``<EOU>`` after a pause the user has not finished: finalizing at the VAD stop
    let that end turns at pauses inside sentences (``bench turns``, docs/BENCHMARKS.md).

    A final after the ``<EOU>`` commits the turn. Without one, ``"eou"`` holds the turn and
    ``"eou_smart"`` asks Smart Turn (complete: commit; incomplete: hold). A held turn ends when an ``<EOU>``
    comes, goes on when the user speaks again, and otherwise commits after the fallback silence (the analyzer's
    ``stop_secs``, 3 s for Smart Turn and without an analyzer, from the speech end): no turn is held for ever.
    With the eager end of turn on, a pause predicts the end of the turn only after an ``<EOU>`` (the engine
    reports the event, not a probability), and the ``<EOU>`` itself triggers the prediction.

    Args:
        analyzer: Smart Turn (``"eou_smart"``), or None (``"eou"``).
        log: Where each decision is recorded.
        vad_stop_secs: The VAD's ``stop_secs``, s.
        eou_wait_s: How long after a VAD stop the STT waits for ``<EOU>`` before it finalizes, s (>= 0; 0:
            finalize at the VAD stop, where the flush's padding can put an ``<EOU>`` at a pause).

    Raises:
        ValueError: A negative or non-finite ``eou_wait_s``.

    """

    wants_eou = True

    def __init__(
        self,
        analyzer: BaseTurnAnalyzer | None = None,
        *,
        log: TurnEndLog | None = None,
        vad_stop_secs: float = 0.2,
        eou_wait_s: float = DEFAULT_EOU_WAIT_S,
    ) -> None:
        if not (isinstance(eou_wait_s, (int, float)) and 0.0 <= eou_wait_s < float("inf")):
            raise ValueError(f"eou_wait_s must be a finite number of seconds >= 0, got {eou_wait_s!r}")
        super().__init__(analyzer, read_text=False, log=log, vad_stop_secs=vad_stop_secs)
        self.mode = "eou_smart" if analyzer is not None else "eou"
        self.eou_wait_s = float(eou_wait_s)
        self._eou = False  # the model emitted <EOU> after the utterance's last words

    @property
    def eou_seen(self) -> bool:
        """Whether the model emitted ``<EOU>`` after the utterance's last words."""
        return self._eou

    def on_words(self) -> None:
        """More words: an earlier ``<EOU>`` was inside the turn."""
        self._eou = False

    def on_speech_start(self, start_secs: float) -> None:
        """The user speaks (again): a hold ends, and an earlier ``<EOU>`` no longer ends the turn.

        A Smart Turn verdict on the pause before it is dropped: that pause was no end of turn.
        """
        super().on_speech_start(start_secs)
        self._eou = False
        task, self._verdict = self._verdict, None
        if task is not None:
            task.add_done_callback(_ignore_result)

    def holds_prediction(self, text: str, language: object | None = None) -> bool:
        """A pause predicts the end of the turn only once the model said so."""
        return not self._eou

    def on_eou(self, final_follows: bool = False) -> bool:
        """The model emitted ``<EOU>``: True when it commits a turn held open at its final.

        Args:
            final_follows: The STT finalizes the utterance now (the tokens the model emitted since the held final,
                often the sentence's punctuation, belong to the turn): that final commits it.

        """
        self._eou = True
        if not self._held or final_follows:
            return False
        self._held = False
        self._hold_ms = None
        self._texts = []
        self._eou = False
        last = self._last or TurnEndDecision(False, "eou")
        self._last = TurnEndDecision(True, "eou", None, last.smart_complete)
        _log_decision(self, self._last, self.log)
        return True

    async def complete(self, text: str = "", language: object | None = None) -> bool:
        """Whether the final now delivered commits the turn: the ``<EOU>`` came, or (``"eou_smart"``) Smart Turn."""
        if not text and not self._texts:  # no speech: nothing to commit or record
            return await TurnCommit.complete(self, text, language)
        task, self._verdict = self._verdict, None
        if self._eou:
            if task is not None:
                task.add_done_callback(_ignore_result)  # the model decided; the analysis ends on its own
            decision = TurnEndDecision(True, "eou")
        elif task is not None:
            smart = await task
            decision = TurnEndDecision(smart, "smart", None, smart)
        else:
            decision = TurnEndDecision(False, "eou")  # held: for the <EOU>, the user, or the fallback silence
        self._last = decision
        self._held = not decision.commit
        self._hold_ms = 0.0 if self._held else None
        self._texts = [*self._texts, text] if self._held and text else []
        if decision.commit:
            self._eou = False
        _log_decision(self, decision, self.log)
        return decision.commit


def _ignore_result(task: asyncio.Task[bool]) -> None:
    if not task.cancelled():
        task.exception()


def user_turn_strategies_for(
    mode: TurnEndMode,
    *,
    analyzer: BaseTurnAnalyzer | None = None,
    language: str = "en",
    log: TurnEndLog | None = None,
) -> UserTurnStrategies:
    """The user aggregator's turn strategies for ``mode`` (the eager end of turn off).

    In ``"eou"`` and ``"eou_smart"`` the STT decides (its :class:`EouTurnCommit`, :func:`turn_commit_for`), and
    these are Pipecat's ``ExternalUserTurnStrategies``, which follow its frames.

    Args:
        mode: ``"smart"``, ``"vad"``, ``"text"``, ``"eou"`` or ``"eou_smart"``.
        analyzer: The turn analyzer for ``"smart"``/``"text"`` (default: a new Smart Turn v3).
        language: Rules used when a transcript names no language.
        log: Where each decision is recorded.

    """
    validate_turn_end(mode)
    if mode in EOU_TURN_END_MODES:  # the STT's EouTurnCommit decides; Pipecat follows its frames
        return ExternalUserTurnStrategies(enable_interruptions=True)
    if mode == "vad":
        analyzer = VADStopAnalyzer()
    elif analyzer is None:
        analyzer = smart_turn_analyzer()
    stop = TranscriptTurnStopStrategy(turn_analyzer=analyzer, read_text=mode == "text", language=language, log=log)
    return UserTurnStrategies(stop=[stop])


def turn_commit_for(
    mode: TurnEndMode,
    *,
    analyzer: BaseTurnAnalyzer | None = None,
    language: str = "en",
    log: TurnEndLog | None = None,
    vad_stop_secs: float = 0.2,
    eou_wait_s: float = DEFAULT_EOU_WAIT_S,
) -> TextTurnCommit:
    """The STT's commit for ``mode``.

    With the eager end of turn on: ``NemotronSTTService(eager=EagerSettings(turn_commit=...))``; ``"eou"`` and
    ``"eou_smart"`` with it off: ``NemotronSTTService(turn_commit=...)``.

    Args:
        mode: ``"smart"``, ``"vad"``, ``"text"``, ``"eou"`` (an :class:`EouTurnCommit` without analyzer) or
            ``"eou_smart"`` (with one).
        analyzer: The turn analyzer for ``"smart"``/``"text"`` (default: a new Smart Turn v3).
        language: Rules used when the STT names no language.
        log: Where each decision is recorded.
        vad_stop_secs: The pipeline VAD's ``stop_secs``, s.
        eou_wait_s: ``"eou"``/``"eou_smart"``: how long after a VAD stop the STT waits for ``<EOU>`` before it
            finalizes, s (:class:`EouTurnCommit`).

    """
    validate_turn_end(mode)
    if mode == "eou":
        return EouTurnCommit(None, log=log, vad_stop_secs=vad_stop_secs, eou_wait_s=eou_wait_s)
    if mode != "vad" and analyzer is None:
        analyzer = smart_turn_analyzer()
    if mode == "eou_smart":
        return EouTurnCommit(analyzer, log=log, vad_stop_secs=vad_stop_secs, eou_wait_s=eou_wait_s)
    return TextTurnCommit(
        analyzer if mode != "vad" else None,
        read_text=mode == "text",
        language=language,
        log=log,
        vad_stop_secs=vad_stop_secs,
    )
