"""``NemotronSTTBase``: what the in-process and the server-backed Nemotron STT services do alike.

:class:`~pipecat_nemotron.stt.NemotronSTTService` (engine in this process) and
:class:`~pipecat_nemotron.server_stt.NemotronServerSTTService` (engine behind a WebSocket) differ only in how
audio reaches the engine and how its results come back. Everything else lives here, once: the runtime
settings (``latency_ms``) and their validation, the TTFS p99 each service announces, the interim and final
frames it pushes (with the ``asr_finalize`` metric) and the tracing hook. A subclass implements the transport:
:meth:`NemotronSTTBase._finalize_p99_ms` (what the finalize time measured so far says) and
:meth:`NemotronSTTBase._apply_latency` (tell the engine about a new latency mode).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loguru import logger
from pipecat.frames.frames import InterimTranscriptionFrame, STTMetadataFrame, TranscriptionFrame
from pipecat.services.settings import NOT_GIVEN, NotGiven, STTSettings, is_given
from pipecat.services.stt_service import STTService
from pipecat.transcriptions.language import Language
from pipecat.utils.time import time_now_iso8601
from pipecat.utils.tracing.service_decorators import traced_stt

from pipecat_nemotron.engine.config import LATENCY_MODES, validate_latency_ms
from pipecat_nemotron.metrics import asr_finalize_metrics_frame

__all__ = [
    "NEMOTRON_TTFS_P99",
    "TTFS_MARGIN",
    "VAD_STOP_SECS",
    "NemotronSTTBase",
    "NemotronSTTSettings",
    "ttfs_p99_from_finalize_ms",
]

#: VAD silence that ends a user turn, seconds: what Pipecat's built-in TTFS values assume, and the agent's default.
VAD_STOP_SECS = 0.2

#: TTFS p99 used before any finalize time was measured: 0.2 s of VAD stop plus 50 ms, the reference finalize
#: p99 on a GPU (24 ms max measured) with margin, seconds.
NEMOTRON_TTFS_P99 = 0.25

#: Safety factor applied to the measured finalize p99 when deriving ``ttfs_p99_latency``.
TTFS_MARGIN = 1.5

#: Smallest finalize share of the derived TTFS p99, ms.
_TTFS_FLOOR_MS = 20.0


def ttfs_p99_from_finalize_ms(finalize_p99_ms: float | None) -> float:
    """TTFS p99 a service announces, from the p99 of its measured finalize times.

    Args:
        finalize_p99_ms: p99 of the finalize times measured so far, ms (None before the first one).

    Returns:
        ``VAD_STOP_SECS`` plus :data:`TTFS_MARGIN` times ``finalize_p99_ms`` (at least 20 ms), rounded to the
        millisecond, or :data:`NEMOTRON_TTFS_P99` when nothing was measured; seconds.

    """
    if finalize_p99_ms is None:
        return NEMOTRON_TTFS_P99
    return round(VAD_STOP_SECS + max(finalize_p99_ms * TTFS_MARGIN, _TTFS_FLOOR_MS) / 1000.0, 3)


@dataclass
class NemotronSTTSettings(STTSettings):
    """Runtime-updatable settings of the Nemotron STT services (store and delta mode).

    Parameters
    ----------
        latency_ms: Latency mode (80, 160, 560 or 1120 ms). A change applies at once if the user is not
            mid-utterance, else at the next utterance boundary. The weights are shared; nothing reloads.

    """

    latency_ms: int | NotGiven = field(default_factory=lambda: NOT_GIVEN)


class NemotronSTTBase(STTService):
    """Base of the Nemotron STT services: settings, TTFS, interim and final frames, tracing.

    Interim text is pushed as ``InterimTranscriptionFrame`` whenever it changes; each user turn ends in one
    ``TranscriptionFrame`` with ``finalized=True`` (Pipecat then reports TTFS) and, with metrics enabled,
    an ``asr_finalize`` processing metric. ``STTUpdateSettingsFrame(delta=NemotronSTTSettings(latency_ms=...))``
    switches the latency mode; the model cannot change at run time.

    Subclasses implement :meth:`_finalize_p99_ms` and :meth:`_apply_latency`, and may override
    :meth:`_model_change_refusal`.
    """

    Settings = NemotronSTTSettings
    _settings: NemotronSTTSettings

    def __init__(
        self,
        *,
        latency_ms: int,
        model: str | None,
        ttfs_p99_latency: float | None = None,
        settings: NemotronSTTSettings | None = None,
        **kwargs: Any,
    ) -> None:
        """Validate and store the settings, then initialise the Pipecat service.

        Args:
            latency_ms: Initial latency mode: 80, 160, 560 or 1120 ms.
            model: Model name reported in the settings (None until a server announces it).
            ttfs_p99_latency: P99 speech-end-to-final time, seconds; None derives it from the measured
                finalize times (:func:`ttfs_p99_from_finalize_ms`).
            settings: Runtime settings (``latency_ms``); override ``latency_ms`` above.
            **kwargs: Passed on to the next base (Pipecat's ``STTService`` or ``WebsocketSTTService``).

        Raises:
            ValueError: Unsupported latency (the message names the allowed values).

        """
        validate_latency_ms(latency_ms)
        default_settings = NemotronSTTSettings(model=model, language=Language.EN, latency_ms=latency_ms)
        if settings is not None:
            default_settings.apply_update(settings)
        validate_latency_ms(default_settings.latency_ms)  # type: ignore[arg-type]
        super().__init__(ttfs_p99_latency=ttfs_p99_latency, settings=default_settings, **kwargs)
        self._explicit_ttfs = ttfs_p99_latency is not None
        self._last_interim = ""

    # ---- what the subclasses implement --------------------------------------------------------------------

    def _finalize_p99_ms(self) -> float | None:
        """p99 of the finalize times measured so far, ms, or None before the first one."""
        raise NotImplementedError

    async def _apply_latency(self) -> None:
        """Switch the engine side of this session to :attr:`latency_ms` (called after the settings changed)."""
        raise NotImplementedError

    def _model_change_refusal(self) -> str:
        """The error pushed when a settings delta asks for another model."""
        return f"the model cannot change at run time (loaded: {self._settings.model})"

    # ---- TTFS and metrics ---------------------------------------------------------------------------------

    @property
    def latency_ms(self) -> int:
        """Latency mode requested in the settings, ms."""
        return int(self._settings.latency_ms)  # type: ignore[arg-type]

    def can_generate_metrics(self) -> bool:
        """Report TTFS and processing metrics."""
        return True

    def service_metadata_frame(self) -> STTMetadataFrame:
        """Broadcast a TTFS p99 derived from the measured finalize times (unless given explicitly)."""
        if not self._explicit_ttfs:
            self._ttfs_p99_latency = self.measured_ttfs_p99()
        return super().service_metadata_frame()

    def measured_ttfs_p99(self) -> float:
        """TTFS p99 from the finalize times measured so far (see :func:`ttfs_p99_from_finalize_ms`), seconds."""
        return ttfs_p99_from_finalize_ms(self._finalize_p99_ms())

    # ---- results ------------------------------------------------------------------------------------------

    async def _push_interim(self, text: str) -> None:
        """Push ``text`` as an ``InterimTranscriptionFrame`` if it is new (empty and repeated text is not)."""
        if text and text != self._last_interim:
            self._last_interim = text
            await self.push_frame(
                InterimTranscriptionFrame(text, self._user_id, time_now_iso8601(), Language.EN)
            )

    async def _push_final(self, text: str, utterance: int, ttf_ms: float, model: str | None) -> bool:
        """Deliver the final of one utterance (a turn with no speech pushes nothing).

        Args:
            text: The utterance's final text ("" when it had no speech).
            utterance: Index of the utterance in the session (for the log).
            ttf_ms: Finalize call to final text, ms.
            model: Model name for the metric.

        Returns:
            Whether a ``TranscriptionFrame`` was pushed.

        """
        self._last_interim = ""
        if not text:
            await self._skip_empty_final(utterance, ttf_ms)
            return False
        await self._deliver_final(text, ttf_ms, model)
        return True

    async def _skip_empty_final(self, utterance: int, ttf_ms: float) -> None:
        """A turn with no speech: no empty transcript is pushed, and there is no TTFS to report."""
        self._finalize_requested = False
        await self._cancel_ttfb_timeout()
        await self.cancel_ttfb_metrics()
        logger.debug(f"{self}: utterance {utterance} had no speech (finalize {ttf_ms:.1f} ms)")

    async def _deliver_final(self, text: str, ttf_ms: float, model: str | None) -> None:
        """Push the finalized ``TranscriptionFrame`` (Pipecat then reports TTFS) and the ASR finalize metric.

        Args:
            text: The utterance's final text (non-empty).
            ttf_ms: Finalize call to final text, ms.
            model: Model name for the metric.

        """
        # Every final answers one finalize request (a VAD stop or the end of the session). Pipecat keeps one
        # request flag, not a count: when finalize requests queued up (audio kept while the model loaded),
        # later finals would lose ``finalized=True``, so each final re-asserts its own request.
        self.request_finalize()
        self.confirm_finalize()
        await self.emit_stt_usage_metrics()
        await self.push_frame(TranscriptionFrame(text, self._user_id, time_now_iso8601(), Language.EN))
        await self._handle_transcription(text, True, Language.EN)
        if self.metrics_enabled:
            await self.push_frame(asr_finalize_metrics_frame(self.name, model, ttf_ms))
        logger.debug(f"{self}: final transcript: {text!r}")

    @traced_stt
    async def _handle_transcription(
        self, transcript: str, is_final: bool, language: Language | None = None
    ) -> None:
        """Tracing hook for a final transcript (spans are opened and closed by ``traced_stt``)."""

    # ---- settings -----------------------------------------------------------------------------------------

    async def _update_settings(self, delta: STTSettings) -> dict[str, Any]:
        """Apply a settings delta: ``latency_ms`` switches this session's mode; other models are refused."""
        await self._check_settings_delta(delta)
        changed = await super()._update_settings(delta)
        if "latency_ms" in changed:
            await self._apply_latency()
            logger.info(f"{self}: latency mode -> {self.latency_ms} ms")
        self._warn_unhandled_updated_settings(set(changed) - {"latency_ms", "model"})
        return changed

    async def _check_settings_delta(self, delta: STTSettings) -> None:
        """Drop (and report) an unsupported ``latency_ms`` or a model change from ``delta`` before applying it."""
        latency_ms = getattr(delta, "latency_ms", NOT_GIVEN)
        if is_given(latency_ms) and latency_ms not in LATENCY_MODES:
            await self.push_error(
                error_msg=f"latency_ms must be one of {sorted(LATENCY_MODES)} (ms), got {latency_ms!r}"
            )
            delta.latency_ms = NOT_GIVEN  # type: ignore[attr-defined]
        if is_given(delta.model) and delta.model != self._settings.model:
            await self.push_error(error_msg=self._model_change_refusal())
            delta.model = NOT_GIVEN
