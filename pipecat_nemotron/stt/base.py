"""``NemotronSTTBase``: what the in-process and the server-backed Nemotron STT services do alike.

:class:`~pipecat_nemotron.stt.NemotronSTTService` (engine in this process) and
:class:`~pipecat_nemotron.stt.remote.service.NemotronServerSTTService` (engine behind a WebSocket) differ only in how
audio reaches the engine and how its results come back. Everything else lives here, once: the runtime
settings (checked in :mod:`~pipecat_nemotron.stt.settings`) and their changes, the TTFS p99 each service announces,
the interim and final frames it pushes (with the ``asr_finalize`` metric) and the tracing hook. The eager end of
turn (Pipecat's ``EagerEndOfTurnSTTServiceMixin``) is an :class:`~pipecat_nemotron.stt.eager_turn.EagerTurn` the
service holds when it is on. A subclass
implements the transport: :meth:`NemotronSTTBase._finalize_p99_ms` (what the finalize time measured so far says),
:meth:`NemotronSTTBase._apply_latency` (tell the engine about a new latency mode) and
:meth:`NemotronSTTBase._peek_text` (the utterance's text as its final would be now, without ending it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loguru import logger
from pipecat.frames.frames import (
    Frame,
    InputAudioRawFrame,
    InterimTranscriptionFrame,
    StartFrame,
    STTMetadataFrame,
    TranscriptionFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.settings import STTSettings, is_given
from pipecat.services.stt_service import STTService
from pipecat.transcriptions.language import Language
from pipecat.turns.eager_end_of_turn_mixin import EagerEndOfTurnSTTServiceMixin
from pipecat.turns.user_turn_strategies import ExternalUserTurnStrategies
from pipecat.utils.time import time_now_iso8601
from pipecat.utils.tracing.service_decorators import traced_stt

from pipecat_nemotron.asr.types import Transcript
from pipecat_nemotron.stt.eager import EagerSettings, TurnCommit, eager_from_kwargs
from pipecat_nemotron.stt.eager_turn import EagerHooks, EagerTurn
from pipecat_nemotron.stt.eou_wait import EouWait
from pipecat_nemotron.stt.metrics import asr_finalize_metrics_frame
from pipecat_nemotron.stt.ready import NemotronSTTUnavailableError, Readiness
from pipecat_nemotron.stt.settings import (
    NemotronSTTSettings,
    delta_refusals,
    frame_language,
    initial_settings,
)
from pipecat_nemotron.stt.ttfs import NEMOTRON_TTFS_P99, TTFS_MARGIN, VAD_STOP_SECS, ttfs_p99_from_finalize_ms

__all__ = [
    "NEMOTRON_TTFS_P99",
    "NemotronSTTUnavailableError",
    "TTFS_MARGIN",
    "VAD_STOP_SECS",
    "NemotronSTTBase",
    "NemotronSTTSettings",
    "frame_language",
    "ttfs_p99_from_finalize_ms",
]


class NemotronSTTBase(EagerEndOfTurnSTTServiceMixin, STTService):
    """Base of the Nemotron STT services: settings, TTFS, interim and final frames, tracing, eager end of turn.

    Interim text is pushed as ``InterimTranscriptionFrame`` whenever it changes; each user turn ends in one
    ``TranscriptionFrame`` with ``finalized=True`` (Pipecat then reports TTFS) and, with metrics enabled,
    an ``asr_finalize`` processing metric. ``STTUpdateSettingsFrame(delta=NemotronSTTSettings(latency_ms=...))``
    switches the latency mode, ``language=...`` the language of a multilingual model (both from the next
    utterance); the model cannot change at run time. Frames carry the language decoded with (or detected).

    With ``enable_eager_end_of_turn=True`` the service also predicts the end of the turn: when the user pauses
    for ``eager_silence_ms`` (see :class:`~pipecat_nemotron.stt.eager.PauseDetector`) it pushes the utterance's
    final-quality text, peeked without ending the utterance, as an ``EagerTranscriptionFrame``, so the LLM starts
    answering while the VAD still waits for its ``stop_secs``; if the user speaks again it withdraws it
    (``EagerEndOfTurnCancelFrame``). The committed end of turn is the VAD stop, as without it: the finalized
    ``TranscriptionFrame``, then a ``ProposedUserStoppedSpeakingFrame``. The service then owns turn detection
    (``ProposedUserStartedSpeakingFrame`` at each VAD start) and recommends Pipecat's
    ``EagerUserTurnStrategies`` in its ``STTMetadataFrame``; the LLM service's ``SpeculationGate`` holds the
    speculative reply until the turn is committed and the committed transcript matches. Every withdrawn or
    mismatched prediction costs one LLM request.

    Subclasses implement :meth:`_finalize_p99_ms`, :meth:`_apply_latency` and :meth:`_peek_text`, may override
    :meth:`_model_change_refusal`, and report the ASR's progress to :meth:`_eager_progress` for the ``"asr"``
    pause signal.
    """

    Settings = NemotronSTTSettings
    _settings: NemotronSTTSettings

    def __init__(
        self,
        *,
        latency_ms: int,
        model: str | None,
        language: Language | str | None = None,
        ttfs_p99_latency: float | None = None,
        settings: NemotronSTTSettings | None = None,
        eager: EagerSettings | None = None,
        boost_phrases: Sequence[str] | None = None,
        boost_alpha: float | None = None,
        turn_commit: TurnCommit | None = None,
        **kwargs: Any,
    ) -> None:
        """Validate and store the settings, then initialise the Pipecat service.

        Args:
            latency_ms: Initial latency mode, one of the model's (80, 160, 560 or 1120 ms; the multilingual model
                adds 320); checked against the model when it is loaded.
            model: Model name reported in the settings (None until a server announces it).
            language: Language of a multilingual model (Pipecat's ``Language``, ``"es-ES"``, ``"es"`` or
                ``"auto"``); None: the model's default (``auto`` on the multilingual model, English on the
                English one). Checked against the model when it is loaded.
            ttfs_p99_latency: P99 speech-end-to-final time, seconds; None derives it from the measured
                finalize times (:func:`ttfs_p99_from_finalize_ms`).
            settings: Runtime settings (:class:`NemotronSTTSettings`); override the arguments above.
            boost_phrases: Phrases to boost, cased as the model writes them (see :class:`NemotronSTTSettings`).
            boost_alpha: Boosting weight in (0, 10]; None: the engine's (or the server's) default.
            eager: The eager end of turn (:class:`~pipecat_nemotron.stt.eager.EagerSettings`): answer a predicted
                end of turn before the VAD commits it. None (the default) turns it off. 0.1's keyword arguments
                (``enable_eager_end_of_turn``, ``eager_silence_ms``, ...) still work, with a deprecation warning.
            turn_commit: What ends the user turn when the STT owns turn detection with the eager end of turn off:
                a commit that reads the model's end-of-utterance events (``TurnCommit.wants_eou``, e.g.
                ``turn_commit_for("eou")``); the STT then opens its stream with ``eou=True`` and pushes
                ``ProposedUserStarted/StoppedSpeakingFrame`` for Pipecat's ``ExternalUserTurnStrategies``. With
                the eager end of turn on, pass it as ``EagerSettings(turn_commit=...)`` instead. None: the user
                aggregator's own strategies end the turn.
            **kwargs: Passed on to the next base (Pipecat's ``STTService`` or ``WebsocketSTTService``).

        Raises:
            ValueError: Unsupported latency (the message names the allowed values), a bad eager or boost setting,
                or ``turn_commit`` given both here and in ``eager``.

        """
        default_settings = initial_settings(
            latency_ms=latency_ms,
            model=model,
            language=language,
            boost_phrases=boost_phrases,
            boost_alpha=boost_alpha,
            settings=settings,
        )
        eager = eager_from_kwargs(eager, kwargs)
        if eager is not None and turn_commit is not None:
            raise ValueError(
                "with the eager end of turn on, pass the turn commit as EagerSettings(turn_commit=...), not turn_commit="
            )
        if eager is not None:
            eager.claim(self)
        super().__init__(
            ttfs_p99_latency=ttfs_p99_latency,
            settings=default_settings,
            enable_eager_end_of_turn=eager is not None,
            eager_match_policy=eager.match_policy if eager is not None else None,
            **kwargs,
        )
        self._explicit_ttfs = ttfs_p99_latency is not None
        self._last_interim = ""
        #: Language prompt of the latest transcript (None: an English-only model).
        self._decoded_language: str | None = None
        self._commit = eager.commit() if eager is not None else (turn_commit or TurnCommit())
        #: The eager end of turn, or the turn detection of an EOU commit without predictions (None: neither).
        self._eager: EagerTurn | None = None
        if eager is not None or self._commit.wants_eou:
            hooks = EagerHooks(
                peek=self._peek_text,
                predict=self._predict_end_of_turn,
                withdraw=self._cancel_eager_end_of_turn,
                user_speaking=lambda: self._user_speaking,
                language=self._frame_language,
            )
            pauses = eager.pause_detector() if eager is not None else None
            hold_words = eager.hold_words if eager is not None else frozenset()
            self._eager = EagerTurn(self, pauses, self._commit, hold_words, hooks)
        #: An EOU commit's VAD stops finalize on the model's ``<EOU>`` (None: every VAD stop finalizes at once).
        self._eou_wait = EouWait(self, self._commit.eou_wait_s, self._end_utterance) if self._commit.wants_eou else None
        #: Whether the subclass's transport can transcribe yet (it calls ``ready()`` / ``fail()``).
        self._readiness = Readiness()

    async def wait_until_ready(self, timeout: float | None = None) -> None:
        """Wait until the service can transcribe (after ``StartFrame``), at most ``timeout`` seconds if given.

        Raises:
            NemotronSTTUnavailableError: The model failed to load, the session could not open (a language the
                model lacks, a server that refused it or cannot be reached), or the session ended first.
            TimeoutError: ``timeout`` passed first.

        """
        await self._readiness.wait(timeout)

    @property
    def turn_commit(self) -> TurnCommit:
        """What decides, when the STT owns turn detection, whether the turn is committed.

        Eager mode's ``EagerSettings.turn_commit``, or ``turn_commit``.
        """
        return self._commit

    @property
    def owns_turn_detection(self) -> bool:
        """Whether this STT ends user turns (``ProposedUserStoppedSpeakingFrame``): eager mode, or an EOU commit."""
        return self._eager is not None

    @property
    def listening_for_eou(self) -> bool:
        """Whether the model's ``<EOU>`` can still end the turn, so the audio after the VAD stop must reach it.

        True while a VAD stop's finalize waits for it, and while the commit holds the turn after a final (the
        model may need more silence than the wait; the user's speech clears both).
        """
        return self._eou_wait is not None and (self._eou_wait.pending or self._commit.held)

    @property
    def wants_eou(self) -> bool:
        """Whether this STT asks the model for end-of-utterance events (its turn commit reads them)."""
        return self._commit.wants_eou

    # ---- what the subclasses implement --------------------------------------------------------------------

    async def _end_utterance(self) -> None:
        """Finalize the open utterance (a VAD stop's, or an EOU commit's after its ``<EOU>``)."""
        raise NotImplementedError

    def _finalize_p99_ms(self) -> float | None:
        """p99 of the finalize times measured so far, ms, or None before the first one."""
        raise NotImplementedError

    async def _apply_latency(self) -> None:
        """Switch the engine side of this session to :attr:`latency_ms` (called after the settings changed)."""
        raise NotImplementedError

    def _latency_modes(self) -> tuple[int, ...] | None:
        """The loaded model's latency modes, ms (None while unknown: any multiple of 80 ms passes for now)."""
        return None

    def _language_problem(self, language: Any) -> str | None:
        """Why the model cannot decode ``language`` (None: it can, or the model is not known yet)."""
        return None

    async def _apply_language(self) -> None:
        """Switch the engine side of this session to :attr:`language` (called after the settings changed)."""
        raise NotImplementedError

    def _check_boost(self, phrases: tuple[str, ...]) -> None:
        """Raise ``ValueError`` if the model (or server) would refuse ``phrases`` (nothing while it is unknown)."""

    async def _apply_boost(self) -> str | None:
        """Give the engine side :attr:`boost_phrases` (after the settings changed); why it refused them, or None."""
        raise NotImplementedError

    def _model_change_refusal(self) -> str:
        """The error pushed when a settings delta asks for another model."""
        return f"the model cannot change at run time (loaded: {self._settings.model})"

    async def _peek_text(self) -> str:
        """The current utterance's text as its final would be now, without ending it (eager end of turn)."""
        raise NotImplementedError

    # ---- TTFS and metrics ---------------------------------------------------------------------------------

    @property
    def latency_ms(self) -> int:
        """Latency mode requested in the settings, ms."""
        return int(self._settings.latency_ms)  # type: ignore[arg-type]

    @property
    def language(self) -> str | None:
        """Language requested in the settings (``"es-ES"``, ``"es"``, ``"auto"``), None: the model's default."""
        value = self._settings.language
        if value is None or not is_given(value):
            return None
        return str(getattr(value, "value", value))

    @property
    def boost_phrases(self) -> tuple[str, ...]:
        """The phrases boosted from the next utterance (normalised: whitespace collapsed, repeats removed)."""
        return self._settings.boost_phrases  # type: ignore[return-value]

    @property
    def boost_alpha(self) -> float | None:
        """The boosting weight asked for; None: the engine's (or the server's) default."""
        return self._settings.boost_alpha  # type: ignore[return-value]

    def language_to_service_language(self, language: Language) -> str | None:
        """Pipecat's ``Language`` as the code the engine resolves against the model's languages."""
        return str(language.value)

    def _frame_language(self) -> Language | None:
        """The ``language`` of the frames pushed now: what the model decoded with (None for ``auto``)."""
        return frame_language(self._decoded_language)

    def can_generate_metrics(self) -> bool:
        """Report TTFS and processing metrics."""
        return True

    def service_metadata_frame(self) -> STTMetadataFrame:
        """Broadcast a TTFS p99 derived from the measured finalize times (unless given explicitly).

        With the eager end of turn on, the frame also recommends Pipecat's ``EagerUserTurnStrategies`` (applied
        unless the pipeline passed its own ``user_turn_strategies``).
        """
        if not self._explicit_ttfs:
            self._ttfs_p99_latency = self.measured_ttfs_p99()
        frame = super().service_metadata_frame()
        if self.eager_end_of_turn_enabled:
            frame.user_turn_strategies = self.recommended_user_turn_strategies(enable_interruptions=True)
        elif self._eager is not None:  # an EOU commit: Pipecat's external strategies follow this STT's frames
            frame.user_turn_strategies = ExternalUserTurnStrategies(enable_interruptions=True)
        return frame

    def measured_ttfs_p99(self) -> float:
        """TTFS p99 from the finalize times measured so far (see :func:`ttfs_p99_from_finalize_ms`), seconds."""
        return ttfs_p99_from_finalize_ms(self._finalize_p99_ms())

    # ---- results ------------------------------------------------------------------------------------------

    async def _push_interim(self, text: str, result: Transcript | None = None) -> None:
        """Push ``text`` as an ``InterimTranscriptionFrame`` (``result``: its words so far) if it is new."""
        if text and text != self._last_interim:
            self._last_interim = text
            if self._commit.wants_eou:  # an end of utterance before these words did not end it
                self._commit.on_words()
            if result is not None:
                self._decoded_language = result.language
            frame = InterimTranscriptionFrame(
                text, self._user_id, time_now_iso8601(), self._frame_language(), result=result
            )
            await self.push_frame(frame)

    async def _push_final(self, result: Transcript, ttf_ms: float, model: str | None) -> bool:
        """Deliver the final of one utterance (a turn with no speech pushes nothing).

        Args:
            result: The utterance's final text ("" when it had no speech), index and words: the
                ``TranscriptionFrame``'s ``result``.
            ttf_ms: Finalize call to final text, ms.
            model: Model name for the metric.

        Returns:
            Whether a ``TranscriptionFrame`` was pushed.

        """
        self._last_interim = ""
        # The turn is committed: whatever was answered eagerly is settled by this transcript.
        self._clear_eager_end_of_turn()
        pushed = bool(result.text)
        if pushed:
            await self._deliver_final(result, ttf_ms, model)
        else:
            await self._skip_empty_final(result.utterance, ttf_ms)
        if self._eager is not None:  # it owns turn detection (Pipecat's external turn strategies)
            await self._eager.on_final(result.text, self._frame_language())
        return pushed

    async def _skip_empty_final(self, utterance: int, ttf_ms: float) -> None:
        """A turn with no speech: no empty transcript is pushed, and there is no TTFS to report."""
        self._finalize_requested = False
        await self._cancel_ttfb_timeout()
        await self.cancel_ttfb_metrics()
        logger.debug(f"{self}: utterance {utterance} had no speech (finalize {ttf_ms:.1f} ms)")

    async def _deliver_final(self, result: Transcript, ttf_ms: float, model: str | None) -> None:
        """Push the finalized ``TranscriptionFrame`` (Pipecat then reports TTFS) and the ASR finalize metric.

        Args:
            result: The utterance's final text (non-empty) and words: the frame's ``text`` and ``result``.
            ttf_ms: Finalize call to final text, ms.
            model: Model name for the metric.

        """
        text = result.text
        self._decoded_language = result.detected_language or result.language
        language = self._frame_language()
        # Every final answers one finalize request (a VAD stop or the end of the session). Pipecat keeps one
        # request flag, not a count: when finalize requests queued up (audio kept while the model loaded),
        # later finals would lose ``finalized=True``, so each final re-asserts its own request.
        self.request_finalize()
        self.confirm_finalize()
        await self.emit_stt_usage_metrics()
        await self.push_frame(
            TranscriptionFrame(text, self._user_id, time_now_iso8601(), language, result=result)
        )
        await self._handle_transcription(text, True, language)
        if self.metrics_enabled:
            await self.push_frame(asr_finalize_metrics_frame(self.name, model, ttf_ms))
        logger.debug(f"{self}: final transcript: {text!r}")

    async def _push_forced_final(self, result: Transcript) -> None:
        """Push the final of an utterance the engine split at ``max_utterance_s`` (the user is still talking).

        A ``TranscriptionFrame`` in order with the others, not ``finalized``: it answers no finalize request,
        settles no eager prediction and reports no finalize time. An empty one pushes nothing.
        """
        self._last_interim = ""
        if not result.text:
            return
        self._decoded_language = result.detected_language or result.language
        language = self._frame_language()
        await self.push_frame(
            TranscriptionFrame(result.text, self._user_id, time_now_iso8601(), language, result=result)
        )
        await self._handle_transcription(result.text, True, language)
        logger.debug(f"{self}: utterance {result.utterance} split at its length limit: {result.text!r}")

    # ---- eager end of turn --------------------------------------------------------------------------------

    async def start(self, frame: StartFrame) -> None:
        """Start the service (and the eager end of turn's VAD, at the input sample rate)."""
        await super().start(frame)
        if self._eager is not None:
            self._eager.start(self.sample_rate)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """Handle frames; a VAD stop finalizes the utterance (an EOU commit's: on the ``<EOU>``, :mod:`.eou_wait`).

        In eager mode, or with an EOU commit, a VAD start also opens a turn and a VAD stop ends the prediction.
        """
        await super().process_frame(frame, direction)
        if isinstance(frame, VADUserStartedSpeakingFrame):
            if self._eou_wait is not None:
                await self._eou_wait.on_speech()
            if self._eager is not None:
                await self._eager.on_vad_start(frame.start_secs)
        elif isinstance(frame, VADUserStoppedSpeakingFrame):
            if self._eager is not None:
                await self._eager.on_vad_stop()
            if self._eou_wait is not None:
                await self._eou_wait.on_vad_stop(self._commit.eou_seen)
            else:
                await self._end_utterance()

    async def process_audio_frame(self, frame: InputAudioRawFrame, direction: FrameDirection) -> None:
        """Transcribe the audio (the subclass's ``run_stt``), then listen for a pause in eager mode."""
        await super().process_audio_frame(frame, direction)
        if self._eager is not None and not self._muted and frame.audio:
            await self._eager.on_audio(frame.audio)

    async def _eager_progress(self, decoded_ms: float, text_changed: bool = False) -> None:
        """The ASR decoded more of this session's audio (ms, any origin); ``text_changed``: the transcript grew."""
        if self._eager is not None:
            await self._eager.on_decoded(decoded_ms, text_changed)

    async def _on_eou(self, utterance: int, eou_ms: float | None, text: str) -> None:
        """The model says utterance ``utterance`` ended at ``eou_ms`` (ms of the session's audio), after ``text``."""
        logger.debug(f"{self}: end of utterance {utterance} at {eou_ms} ms: {text!r}")
        # The <EOU> ends the utterance after a VAD stop whose finalize waits for it, and after a final the commit
        # held (the user silent since): the model needed more audio than the wait, and what it emitted since
        # (often the sentence's punctuation) belongs to that turn. Either way the final that follows commits.
        ends = self.listening_for_eou
        if self._eager is not None:
            await self._eager.on_eou(final_follows=ends)
        if ends and self._eou_wait is not None:
            await self._eou_wait.finalize_now()

    async def _stop_eou_wait(self) -> None:
        """The session ends: no held finalize fires after this (the session's own finalize covers it)."""
        if self._eou_wait is not None:
            await self._eou_wait.close()

    async def _predict_end_of_turn(self, text: str) -> None:
        """Push ``text`` as the predicted end of the user's turn (an ``EagerTranscriptionFrame``)."""
        await self._push_eager_end_of_turn(text, user_id=self._user_id, language=self._frame_language())

    async def cleanup(self) -> None:
        """Stop a peek still running; a caller still waiting for readiness learns that it will not come."""
        await self._stop_eou_wait()
        if self._eager is not None:
            await self._eager.close()
        if not self._readiness.settled:
            self._readiness.fail(f"{self}: the session ended before the service was ready")
        await super().cleanup()

    @traced_stt
    async def _handle_transcription(
        self, transcript: str, is_final: bool, language: Language | None = None
    ) -> None:
        """Tracing hook for a final transcript (spans are opened and closed by ``traced_stt``)."""

    # ---- settings -----------------------------------------------------------------------------------------

    async def _update_settings(self, delta: STTSettings) -> dict[str, Any]:
        """Apply a settings delta: ``latency_ms`` and ``language`` switch this session; other models are refused."""
        await self._check_settings_delta(delta)
        changed = await super()._update_settings(delta)
        if "latency_ms" in changed:
            await self._apply_latency()
            logger.info(f"{self}: latency mode -> {self.latency_ms} ms")
        if "language" in changed:
            await self._apply_language()
            logger.info(
                f"{self}: language -> {self.language or 'the model default'} (from the next utterance)"
            )
        boost = {"boost_phrases", "boost_alpha"}
        if changed.keys() & boost and (refusal := await self._apply_boost()) is not None:
            for name in boost & changed.keys():  # the engine refused them: the settings keep the previous ones
                setattr(self._settings, name, changed.pop(name))
            await self.push_error(error_msg=f"boost phrases unchanged: {refusal}")
        elif changed.keys() & boost:
            logger.info(f"{self}: {len(self.boost_phrases)} boosted phrase(s) from the next utterance")
        self._warn_unhandled_updated_settings(set(changed) - {"latency_ms", "model", "language", *boost})
        return changed

    async def _check_settings_delta(self, delta: STTSettings) -> None:
        """Drop (and report) an unsupported ``latency_ms`` or ``language``, or a model change, from ``delta``."""
        for refusal in delta_refusals(
            delta,
            model=self._settings.model,
            latency_modes=self._latency_modes,
            language_problem=self._language_problem,
            model_refusal=self._model_change_refusal,
            check_boost=self._check_boost,
        ):
            await self.push_error(error_msg=refusal)
