"""``MagpieTTSService``: NVIDIA Magpie TTS running in this process (local GPU, or CPU), streamed frame by frame.

This is the in-process counterpart of Pipecat's ``NvidiaTTSService``, which talks to a Magpie NIM server over gRPC.
The model work lives in :mod:`pipecat_nemotron.tts.magpie` (no Pipecat imports); this module adapts it to Pipecat.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import numpy as np
from loguru import logger
from pipecat.audio.resamplers.base_audio_resampler import BaseAudioResampler
from pipecat.audio.utils import create_stream_resampler
from pipecat.frames.frames import CancelFrame, Frame, StartFrame, TTSAudioRawFrame
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TTSService
from pipecat.transcriptions.language import Language
from pipecat.utils.tracing.service_decorators import traced_tts
from pipecat.utils.types import NOT_GIVEN, is_given

from pipecat_nemotron.tts.magpie import (
    DEFAULT_MAGPIE_MODEL,
    MagpieEngine,
    MagpieEngineError,
    MagpieSynthesisError,
    MagpieSynthesisOptions,
    SynthesisStream,
    normalize_language,
    normalize_voice,
    shared_magpie_engines,
)

_RESAMPLER_FLUSH_S = (
    0.05  # Silence pushed through the stream resampler to release its last samples, in seconds.
)


@dataclass
class MagpieTTSSettings(TTSSettings):
    """Runtime-updatable settings of :class:`MagpieTTSService`.

    Attributes:
        model: The Magpie checkpoint (read-only: set it with ``MagpieTTSService(model=...)``).
        voice: ``"john"``, ``"sofia"``, ``"aria"``, ``"jason"`` or ``"leo"`` (any case).
        language: ``"en"``, ``"es"``, ``"de"``, ``"fr"``, ``"it"``, ``"vi"`` or ``"zh"``; regional variants and
            Pipecat ``Language`` values resolve to these.

    """


class _PCMResampler:
    """Streams int16 mono PCM from one rate to another with Pipecat's stream resampler, keeping its tail."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self._in_rate = in_rate
        self._out_rate = out_rate
        # Never clear the history on a pause: a slow CPU can take longer than Pipecat's 0.2 s default per chunk.
        self._resampler: BaseAudioResampler = create_stream_resampler(clear_after_secs=None)
        self._in_samples = 0
        self._out_samples = 0

    async def resample(self, audio: np.ndarray) -> bytes:
        if self._in_rate == self._out_rate:
            return audio.tobytes()
        self._in_samples += len(audio)
        out = await self._resampler.resample(audio.tobytes(), self._in_rate, self._out_rate)
        self._out_samples += len(out) // 2
        return out

    async def flush(self) -> bytes:
        """Release the samples still held in the resampler, so the output has the input's full duration."""
        missing = round(self._in_samples * self._out_rate / self._in_rate) - self._out_samples
        if self._in_rate == self._out_rate or missing <= 0:
            return b""
        silence = np.zeros(int(self._in_rate * _RESAMPLER_FLUSH_S), dtype=np.int16).tobytes()
        tail = await self._resampler.resample(silence, self._in_rate, self._out_rate)
        return tail[: 2 * missing]


class MagpieTTSService(TTSService):
    """Pipecat TTS service running NVIDIA Magpie TTS (``MagpieTTSModel``) in this process.

    The model runs on the GPU when one is visible (``device="auto"``), else on the CPU, beside the in-process ASR.
    Audio streams before the sentence is finished: codec frames are decoded as the model generates them (the first
    chunk after ``options.first_chunk_frames`` frames, about 46 ms of audio each), at the codec's sample rate
    (22,050 Hz for the released model), resampled to the pipeline's output rate.

    Concurrency: the model is owned by one worker thread of a :class:`~pipecat_nemotron.tts.magpie.MagpieEngine` and
    never runs on the event loop. Services naming the same (model, device, codec) share one engine and one copy of
    the model through ``shared_magpie_engines`` (reference-counted; the model stays loaded between sessions unless
    ``shared_magpie_engines.unload_when_unused`` is set), or pass ``engine=`` explicitly.
    Requests from all sessions sharing an engine are decoded together (continuous batching: each advances one codec
    frame per decoder step, up to the engine's ``max_batch``; more wait first-in first-out).

    Interruptions cancel the running request: synthesis stops at the next decoder step and its row is freed.
    """

    Settings = MagpieTTSSettings
    _settings: Settings

    def __init__(
        self,
        *,
        model: str = DEFAULT_MAGPIE_MODEL,
        device: str = "auto",
        codec_model_path: str | None = None,
        engine: MagpieEngine | None = None,
        options: MagpieSynthesisOptions | None = None,
        settings: Settings | None = None,
        **kwargs: Any,
    ) -> None:
        """Create the service and start loading the model (unless ``engine`` is given).

        Args:
            model: Hub id (default ``nvidia/magpie_tts_multilingual_357m``) or path to a ``.nemo`` checkpoint.
                Ignored when ``engine`` is given.
            device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
            codec_model_path: Codec ``.nemo`` path (or hub id) overriding the one stored in a local checkpoint.
            engine: An engine to use instead of the process-wide shared one (the caller keeps ownership).
            options: Init-only synthesis options (max duration, chunk sizes, CFG).
            settings: Runtime-updatable settings (voice, language); defaults to voice ``"aria"``, language ``"en"``.
            **kwargs: Passed to Pipecat's ``TTSService`` (e.g. ``sample_rate`` to force an output rate in Hz).

        Raises:
            ValueError: Unknown voice or language (the message lists the allowed values), or a model in
                ``settings`` that differs from ``model``.
            ImportError: NeMo's TTS collection is missing (the message names ``pipecat-nemotron[tts]``).
            FileNotFoundError: A local checkpoint or codec path does not exist.

        """
        if options is not None and not isinstance(options, MagpieSynthesisOptions):
            raise TypeError(f"options must be MagpieSynthesisOptions, got {type(options).__name__}")
        model_name = engine.model_name if engine is not None else model
        default_settings = self.Settings(model=model_name, voice="aria", language="en")
        if settings is not None:
            settings = settings.copy()
            if is_given(settings.model) and settings.model != model_name:
                raise ValueError(
                    f"The Magpie model cannot be set through settings ({settings.model!r}); "
                    "pass MagpieTTSService(model=...) or engine=."
                )
            if is_given(settings.voice):
                settings.voice = normalize_voice(settings.voice)
            if is_given(settings.language):
                settings.language = normalize_language(settings.language)
            default_settings.apply_update(settings)

        super().__init__(push_start_frame=True, push_stop_frames=True, settings=default_settings, **kwargs)

        self._options = options or MagpieSynthesisOptions()
        self._owns_engine = engine is None
        self._engine = (
            engine
            if engine is not None
            else shared_magpie_engines.acquire(model, device=device, codec_model_path=codec_model_path)
        )
        self._stream: SynthesisStream | None = None

    @property
    def engine(self) -> MagpieEngine:
        """The engine (model and worker thread) this service synthesises with."""
        return self._engine

    @property
    def options(self) -> MagpieSynthesisOptions:
        """The init-only synthesis options."""
        return self._options

    def can_generate_metrics(self) -> bool:
        """Whether this service reports TTFB and usage metrics (it does)."""
        return True

    def language_to_service_language(self, language: Language) -> str | None:
        """Map a Pipecat ``Language`` to Magpie's code (``Language.EN_US`` -> ``"en"``), or None if unsupported."""
        try:
            return normalize_language(language)
        except ValueError:
            return None

    async def _update_settings(self, delta: TTSSettings) -> dict[str, Any]:
        """Apply a runtime settings delta, rejecting (with an error frame) values Magpie cannot use."""
        delta = delta.copy()
        if is_given(delta.model) and delta.model != self._settings.model:
            await self.push_error(
                f"{self}: the Magpie model cannot change at runtime (ignoring {delta.model!r}); "
                "create another MagpieTTSService instead"
            )
            delta.model = NOT_GIVEN
        for name, normalize in (("voice", normalize_voice), ("language", normalize_language)):
            value = getattr(delta, name)
            if not is_given(value):
                continue
            try:
                setattr(delta, name, normalize(value))
            except ValueError as e:
                await self.push_error(f"{self}: {e}")
                setattr(delta, name, NOT_GIVEN)
        return await super()._update_settings(delta)

    async def start(self, frame: StartFrame) -> None:
        """Start the service once the model is loaded (waits off the event loop)."""
        await super().start(frame)
        try:
            await self._engine.wait_ready()
        except MagpieEngineError as e:
            await self.push_error(f"{self}: {e}", exception=e, force_treat_as_permanent=True)

    async def cancel(self, frame: CancelFrame) -> None:
        """Stop any running synthesis and cancel the service."""
        self._cancel_stream()
        await super().cancel(frame)

    async def cleanup(self) -> None:
        """Release the shared engine (it stays loaded for later sessions unless the registry unloads unused ones)."""
        self._cancel_stream()
        await super().cleanup()
        if self._owns_engine:
            self._owns_engine = False
            shared_magpie_engines.release(self._engine)

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """Stop the running synthesis when the bot is interrupted."""
        self._cancel_stream()
        await super().on_audio_context_interrupted(context_id)

    def _cancel_stream(self) -> None:
        if self._stream is not None:
            self._stream.cancel()

    @traced_tts
    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """Synthesise ``text``, yielding audio frames as soon as the model produces them.

        Args:
            text: The text to speak.
            context_id: The audio context the frames belong to.

        Yields:
            ``TTSAudioRawFrame`` chunks at ``self.sample_rate``, mono int16.

        """
        if not any(c.isalnum() for c in text):
            return
        try:
            stream = self._engine.submit(
                text,
                voice=str(self._settings.voice),
                language=str(self._settings.language),
                options=self._options,
            )
        except MagpieEngineError as e:
            await self.push_error(f"{self}: {e}", exception=e)
            return
        self._stream = stream
        resampler: _PCMResampler | None = None
        try:
            await self.start_tts_usage_metrics(text)
            async for chunk in stream:
                await self.stop_ttfb_metrics()
                if resampler is None:
                    resampler = _PCMResampler(chunk.sample_rate, self.sample_rate)
                audio = await resampler.resample(chunk.audio)
                if audio:
                    yield TTSAudioRawFrame(
                        audio=audio, sample_rate=self.sample_rate, num_channels=1, context_id=context_id
                    )
            tail = await resampler.flush() if resampler is not None else b""
            if tail:
                yield TTSAudioRawFrame(
                    audio=tail, sample_rate=self.sample_rate, num_channels=1, context_id=context_id
                )
            stats = stream.stats
            logger.trace(
                f"{self}: #{stream.id} {stream.status}, {stats.frames} frames, "
                f"queued {stats.queue_wait_s or 0.0:.3f} s, first audio {stats.time_to_first_audio_s or 0.0:.3f} s"
            )
        except MagpieSynthesisError as e:
            await self.push_error(f"{self}: {e}", exception=e)
        finally:
            # Runs on normal exit and when the task is cancelled by an interruption: a running request stops at its
            # next codec frame, a queued one is skipped.
            stream.cancel()
            if self._stream is stream:
                self._stream = None
