"""What the in-process and the server-backed Nemotron STT services do alike at the end of a turn."""

from __future__ import annotations

from loguru import logger
from pipecat.frames.frames import TranscriptionFrame
from pipecat.services.settings import NOT_GIVEN, STTSettings, is_given
from pipecat.services.stt_service import STTService
from pipecat.transcriptions.language import Language
from pipecat.utils.time import time_now_iso8601

from pipecat_nemotron.engine.config import LATENCY_MODES
from pipecat_nemotron.metrics import asr_finalize_metrics_frame

#: VAD silence that ends a user turn, seconds: what Pipecat's built-in TTFS values assume, and the agent's default.
VAD_STOP_SECS = 0.2


class NemotronFinalsMixin(STTService):
    """Delivery of finals and validation of settings deltas, shared by the Nemotron STT services.

    Subclasses define ``_handle_transcription`` (decorated with ``traced_stt``) and ``_settings.latency_ms``.
    """

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

    async def _check_settings_delta(self, delta: STTSettings, model_error: str) -> None:
        """Drop (and report) an unsupported ``latency_ms`` or a model change from ``delta`` before applying it."""
        latency_ms = getattr(delta, "latency_ms", NOT_GIVEN)
        if is_given(latency_ms) and latency_ms not in LATENCY_MODES:
            await self.push_error(
                error_msg=f"latency_ms must be one of {sorted(LATENCY_MODES)} (ms), got {latency_ms!r}"
            )
            delta.latency_ms = NOT_GIVEN  # type: ignore[attr-defined]
        if is_given(delta.model) and delta.model != self._settings.model:
            await self.push_error(error_msg=model_error)
            delta.model = NOT_GIVEN

    async def _handle_transcription(
        self, transcript: str, is_final: bool, language: Language | None = None
    ) -> None:
        raise NotImplementedError
