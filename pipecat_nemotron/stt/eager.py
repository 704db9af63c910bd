"""When a pause in the user's speech is long enough to answer before the turn is committed.

The Nemotron STT services' eager end of turn (``enable_eager_end_of_turn=True``) peeks at the utterance's
final-quality text when the user pauses for ``eager_silence_ms``, well before the VAD's ``stop_secs`` commits
the turn, and withdraws that prediction when the user speaks again. :class:`PauseDetector` decides both from
one of two signals, or both:

- ``"vad"``: a VAD analyzer of the service's own (Pipecat's Silero by default) with ``stop_secs`` set to the
  eager silence: the pause starts when it turns quiet after speech and ends when it hears speech again. Its
  decisions move in 32 ms VAD frames.
- ``"asr"``: the ASR's blank run: decoded audio since the transcript last changed. It moves in model steps
  (one chunk, 160 ms in the default mode) and trails the audio by the chunk, so it fires later than the VAD.
- ``"both"``: a pause needs both; either one ends it.

``python -m pipecat_nemotron.bench eager`` measures each (``docs/BENCHMARKS.md``): ``"vad"`` is the default.

:class:`TurnCommit` decides when the turn is committed: at the VAD stop, or, with a turn analyzer (Pipecat's
Smart Turn), when the analyzer says the turn is complete (at the VAD stop, or after its own longer silence).
"""

from __future__ import annotations

import asyncio
import enum
import warnings
import weakref
from dataclasses import dataclass
from typing import Literal, get_args

from pipecat.audio.turn.base_turn_analyzer import BaseTurnAnalyzer, EndOfTurnState
from pipecat.audio.vad.vad_analyzer import VADAnalyzer, VADParams, VADState
from pipecat.turns.user_stop import EagerMatchPolicy

__all__ = [
    "DEFAULT_EAGER_SILENCE_MS",
    "EAGER_VAD_START_SECS",
    "HOLD_WORDS",
    "EagerSettings",
    "EagerSignal",
    "PauseDetector",
    "PauseEvent",
    "TurnCommit",
    "ends_mid_sentence",
    "pause_held_by",
]

#: What detects a pause: the service's own VAD, the ASR's blank run, or both.
EagerSignal = Literal["vad", "asr", "both"]

#: Silence after speech that triggers an eager end of turn by default, ms (the commit waits 200 ms).
DEFAULT_EAGER_SILENCE_MS = 64.0

#: Speech the eager VAD needs to hear before it counts the user as speaking (again), seconds.
EAGER_VAD_START_SECS = 0.064

#: English words a turn rarely ends on (articles, conjunctions, prepositions, auxiliaries, question words,
#: possessives, arithmetic operators): a pause after one is taken as mid-sentence ("set a timer for ...").
HOLD_WORDS: frozenset[str] = frozenset(
    "a an the and or but so because if than for to of in on at by with from into about is are was were am be "
    "been do does did can could will would should shall may might must what which who whom whose how when "
    "where why my your our their his its times plus minus".split()
)


def ends_mid_sentence(text: str, hold_words: frozenset[str] = HOLD_WORDS) -> bool:
    """Whether ``text``'s last word is one of ``hold_words`` (case and punctuation aside)."""
    words = text.split()
    return bool(words) and words[-1].strip(".,!?;:'\"").lower() in hold_words


@dataclass(frozen=True)
class EagerSettings:
    """The eager end of turn of a Nemotron STT service: answer a predicted end of turn before the VAD commits it.

    Pass it as ``NemotronSTTService(eager=EagerSettings())`` (or to ``NemotronServerSTTService``); ``eager=None``,
    the default, turns it off (each withdrawn prediction costs an LLM request).

    Attributes:
        silence_ms: Pause after speech that predicts the end of the turn, ms (shorter than the VAD's
            ``stop_secs``, which commits it).
        signal: What detects the pause: ``"vad"`` (the service's own VAD, the default), ``"asr"`` (the
            transcript's blank run) or ``"both"``.
        vad_analyzer: The VAD for the ``"vad"`` signal (default: Silero, ``stop_secs`` = ``silence_ms``).
        match_policy: When the committed transcript still matches the predicted one (Pipecat's
            ``NormalizedMatch`` by default: case and punctuation aside).
        turn_analyzer: Also ask this turn analyzer (e.g. Pipecat's ``LocalSmartTurnAnalyzerV3()``) at each VAD
            stop: the turn is committed only when it says the turn is complete (else after its own longer
            silence, or the user goes on). None: the VAD stop commits.
        hold_words: A pause after one of these words is mid-sentence: no prediction (default:
            :data:`HOLD_WORDS`, English function words; empty: predict at every pause).
        turn_commit: What decides the commit at each VAD stop and which pauses predict nothing (e.g.
            :func:`pipecat_nemotron.agent.turn_end.turn_commit_for`, which also reads the final's words); replaces
            ``turn_analyzer``. None: ``TurnCommit(turn_analyzer)``. One per service: it keeps per-session state.

    A bad ``silence_ms`` or ``signal`` is refused when a service is built with it (:class:`PauseDetector`).

    """

    silence_ms: float = DEFAULT_EAGER_SILENCE_MS
    signal: EagerSignal = "vad"
    vad_analyzer: VADAnalyzer | None = None
    match_policy: EagerMatchPolicy | None = None
    turn_analyzer: BaseTurnAnalyzer | None = None
    hold_words: frozenset[str] = HOLD_WORDS
    turn_commit: TurnCommit | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "hold_words", frozenset(self.hold_words))

    def claim(self, service: object) -> None:
        """Bind this settings' stateful parts (VAD, turn analyzer, turn commit) to ``service``.

        Raises:
            ValueError: One of them is already in use by another live service: they keep per-session state, so
                each service needs its own (build a new ``EagerSettings`` per service).

        """
        for part in (self.vad_analyzer, self.turn_analyzer, self.turn_commit):
            if part is None:
                continue
            owner = _OWNERS.get(part)
            if owner is not None and owner() not in (None, service):
                raise ValueError(
                    f"the {type(part).__name__} of these EagerSettings is already used by {owner()}: it keeps "
                    "per-session state, so give each STT service its own (a new EagerSettings per service)"
                )
            _OWNERS[part] = weakref.ref(service)

    def commit(self) -> TurnCommit:
        """What decides, at each VAD stop, whether the turn is committed."""
        return self.turn_commit or TurnCommit(self.turn_analyzer)

    def pause_detector(self) -> PauseDetector:
        """A new :class:`PauseDetector` with these settings (one per service: it keeps per-session state)."""
        return PauseDetector(silence_ms=self.silence_ms, signal=self.signal, vad_analyzer=self.vad_analyzer)


#: Which live service each stateful part of an ``EagerSettings`` belongs to (see :meth:`EagerSettings.claim`).
_OWNERS: weakref.WeakKeyDictionary[object, weakref.ref[object]] = weakref.WeakKeyDictionary()

#: The eager keyword arguments of 0.1 (``NemotronSTTService(enable_eager_end_of_turn=True, eager_...)``) and the
#: ``EagerSettings`` field each one sets.
LEGACY_EAGER_KWARGS = {
    "eager_silence_ms": "silence_ms",
    "eager_signal": "signal",
    "eager_vad_analyzer": "vad_analyzer",
    "eager_match_policy": "match_policy",
    "eager_turn_analyzer": "turn_analyzer",
    "eager_hold_words": "hold_words",
}


def eager_from_kwargs(eager: EagerSettings | None, kwargs: dict) -> EagerSettings | None:
    """Take 0.1's eager keyword arguments out of ``kwargs`` (warning that they are deprecated) into settings.

    Raises:
        ValueError: Both ``eager`` and the old keywords were given.

    """
    enable = kwargs.pop("enable_eager_end_of_turn", None)
    fields = {new: kwargs.pop(old) for old, new in LEGACY_EAGER_KWARGS.items() if old in kwargs}
    if enable is None and not fields:
        return eager
    if eager is not None:
        raise ValueError("pass eager=EagerSettings(...) or the old eager_* arguments, not both")
    warnings.warn(
        "enable_eager_end_of_turn and eager_* arguments are deprecated: pass eager=EagerSettings(...)",
        DeprecationWarning,
        stacklevel=4,
    )
    return EagerSettings(**fields) if enable else None


class PauseEvent(enum.Enum):
    """A change :class:`PauseDetector` reports."""

    PAUSE = "pause"
    RESUME = "resume"


class PauseDetector:
    """Tells, from a user turn's audio and its transcript's progress, when the user pauses and resumes.

    Call :meth:`start` once the sample rate is known, :meth:`reset` at every turn boundary, :meth:`on_audio`
    with every input audio frame, and :meth:`on_decoded` whenever the ASR has decoded more audio (with
    ``text_changed`` when the transcript grew). Each returns the :class:`PauseEvent` it caused, if any.

    Args:
        silence_ms: Silence after speech that makes a pause, ms (the VAD rounds it to its 32 ms frames).
        signal: ``"vad"``, ``"asr"`` or ``"both"`` (see the module docstring).
        vad_analyzer: The VAD to run for ``"vad"``/``"both"`` (default: a Silero analyzer with
            ``stop_secs=silence_ms``, ``start_secs`` :data:`EAGER_VAD_START_SECS` and Pipecat's default
            confidence and volume thresholds). Not the pipeline's VAD: this one runs on the same audio with a
            shorter stop.

    Raises:
        ValueError: ``silence_ms`` is not positive, or ``signal`` is not one of the three.

    """

    def __init__(
        self,
        *,
        silence_ms: float = DEFAULT_EAGER_SILENCE_MS,
        signal: EagerSignal = "vad",
        vad_analyzer: VADAnalyzer | None = None,
    ) -> None:
        if not silence_ms > 0:
            raise ValueError(f"eager_silence_ms must be > 0 (ms), got {silence_ms!r}")
        if signal not in get_args(EagerSignal):
            raise ValueError(f"eager_signal must be one of {list(get_args(EagerSignal))}, got {signal!r}")
        self.silence_ms = float(silence_ms)
        self.signal: EagerSignal = signal
        self._vad = vad_analyzer
        self._vad_state = VADState.QUIET
        self._heard_speech = False
        self._paused = False
        self._text_at_ms: float | None = None
        self._decoded_ms = 0.0
        self._text_since_pause = False

    @property
    def uses_vad(self) -> bool:
        """Whether the VAD takes part (``"vad"`` or ``"both"``)."""
        return self.signal != "asr"

    @property
    def uses_asr(self) -> bool:
        """Whether the ASR's blank run takes part (``"asr"`` or ``"both"``)."""
        return self.signal != "vad"

    @property
    def paused(self) -> bool:
        """The user is pausing now (since the last :attr:`PauseEvent.PAUSE`, until a resume)."""
        return self._paused

    def start(self, sample_rate: int) -> None:
        """Create the VAD if it is needed and not given, and set its sample rate (Hz; Silero: 8 or 16 kHz)."""
        if not self.uses_vad:
            return
        if self._vad is None:
            from pipecat.audio.vad.silero import SileroVADAnalyzer

            self._vad = SileroVADAnalyzer(
                params=VADParams(start_secs=EAGER_VAD_START_SECS, stop_secs=self.silence_ms / 1000.0)
            )
        self._vad.set_sample_rate(sample_rate)

    def reset(self) -> None:
        """Forget the turn (at the start and the end of every user turn)."""
        self._heard_speech = False
        self._paused = False
        self._text_at_ms = None
        self._text_since_pause = False

    async def on_audio(self, audio: bytes) -> PauseEvent | None:
        """Run the VAD on one input audio frame (16-bit mono PCM at the started rate)."""
        if self._vad is None or not self.uses_vad:
            return None
        self._vad_state = await self._vad.analyze_audio(audio)
        if self._vad_state == VADState.SPEAKING:
            self._heard_speech = True
        return self._update()

    def on_decoded(self, decoded_ms: float, text_changed: bool = False) -> PauseEvent | None:
        """Take the ASR's progress: audio decoded so far (ms, any origin) and whether the transcript grew."""
        self._decoded_ms = decoded_ms
        if text_changed:
            self._text_at_ms = decoded_ms
            self._text_since_pause = True
        if not self.uses_asr:
            return None
        return self._update()

    def _quiet(self) -> bool:
        vad_quiet = self._heard_speech and self._vad_state == VADState.QUIET
        asr_quiet = self._text_at_ms is not None and self._decoded_ms - self._text_at_ms >= self.silence_ms
        if self.signal == "vad":
            return vad_quiet
        if self.signal == "asr":
            return asr_quiet
        return vad_quiet and asr_quiet

    def _resumed(self) -> bool:
        vad_resumed = self.uses_vad and self._vad_state == VADState.SPEAKING
        asr_resumed = self.uses_asr and self._text_since_pause
        return vad_resumed or asr_resumed

    def _update(self) -> PauseEvent | None:
        if not self._paused and self._quiet():
            self._paused = True
            self._text_since_pause = False
            return PauseEvent.PAUSE
        if self._paused and self._resumed():
            self._paused = False
            return PauseEvent.RESUME
        return None


class TurnCommit:
    """When a VAD stop commits the user turn: at once, or when a turn analyzer (Smart Turn) says it is complete.

    Feed it every input audio frame (:meth:`on_audio`) and the VAD's starts and stops; ask :meth:`complete` when
    the final transcript is ready. Without an analyzer every VAD stop commits.

    Args:
        analyzer: E.g. Pipecat's ``LocalSmartTurnAnalyzerV3()``; None commits at every VAD stop.

    """

    #: The commit reads the model's end-of-utterance events (:meth:`on_eou`): the STT opens its stream with
    #: ``eou=True``, owns turn detection even with the eager end of turn off, and needs a model with ``<EOU>``.
    wants_eou: bool = False
    #: How long after a VAD stop the STT waits for the model's ``<EOU>`` before it finalizes the utterance, s
    #: (:attr:`wants_eou` only; 0: it finalizes at the VAD stop). See ``EouTurnCommit``.
    eou_wait_s: float = 0.0

    def __init__(self, analyzer: BaseTurnAnalyzer | None = None) -> None:
        self.analyzer = analyzer
        self._verdict: asyncio.Task[bool] | None = None
        self._held = False  # the analyzer called the last stop incomplete: the turn is still open

    def start(self, sample_rate: int) -> None:
        """Set the analyzer's sample rate, Hz."""
        if self.analyzer is not None:
            self.analyzer.set_sample_rate(sample_rate)

    def on_audio(self, audio: bytes, speaking: bool) -> bool:
        """Give the analyzer one input frame; True when it now completes a turn it had held open."""
        if self.analyzer is None:
            return False
        state = self.analyzer.append_audio(audio, speaking)
        if state == EndOfTurnState.COMPLETE and self._held:
            self._held = False
            return True
        return False

    def on_speech_start(self, start_secs: float) -> None:
        """The VAD heard speech (again): an open turn goes on."""
        if self.analyzer is not None:
            self.analyzer.update_vad_start_secs(start_secs)
        self._held = False

    def on_vad_stop(self) -> None:
        """The VAD stopped: ask the analyzer now (off the frame path), for :meth:`complete`."""
        if self.analyzer is not None:
            self._verdict = asyncio.get_running_loop().create_task(self._analyze(self.analyzer))

    @staticmethod
    async def _analyze(analyzer: BaseTurnAnalyzer) -> bool:
        state, _ = await analyzer.analyze_end_of_turn()
        return state == EndOfTurnState.COMPLETE

    def holds_prediction(self, text: str, language: object | None = None) -> bool:
        """Whether a pause after ``text`` is no end of turn to predict (a subclass reads the words; here: never)."""
        return False

    def on_words(self) -> None:
        """The utterance's text grew (an interim): an end-of-utterance event before it no longer ends it."""

    def on_eou(self, final_follows: bool = False) -> bool:
        """The model emitted ``<EOU>`` (:attr:`wants_eou` only); True when that commits a turn held open.

        Args:
            final_follows: The STT finalizes the utterance now: the final, not this call, commits the turn.

        """
        return False

    @property
    def held(self) -> bool:
        """Whether the last final was held open (the turn goes on until the analyzer, the user or an event)."""
        return self._held

    @property
    def eou_seen(self) -> bool:
        """Whether the model emitted ``<EOU>`` after the utterance's last words (:attr:`wants_eou` only)."""
        return False

    async def complete(self, text: str = "", language: object | None = None) -> bool:
        """Whether the final now delivered (``text``, the utterance's) commits the turn (False: held open)."""
        verdict, self._verdict = self._verdict, None
        if verdict is None:
            return True
        self._held = not await verdict
        return not self._held


def pause_held_by(text: str, hold_words: frozenset[str], commit: TurnCommit, language: object | None = None) -> str | None:
    """Why a pause after ``text`` (the utterance so far) predicts no end of turn, or None when it predicts one.

    Returns:
        ``"before any word"`` (nothing to answer yet), ``"after 'for'"`` (a hold word, or text the commit reads as
        going on), or None.

    """
    words = text.split()
    if not words:
        return "before any word"
    if ends_mid_sentence(text, hold_words) or commit.holds_prediction(text, language):
        return f"after {words[-1]!r}"
    return None
