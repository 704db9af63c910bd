"""The Magpie TTS engine: one loaded ``MagpieTTSModel``, one worker thread, continuous batching of requests.

Threading model, as the ASR engine's (:mod:`pipecat_nemotron.asr.engine`):

- The engine owns one worker thread, and only that thread runs the model: it loads it, warms it up, then serves
  requests through the scheduler (:mod:`~pipecat_nemotron.tts.magpie.scheduler`). Callers never block on the model
  and an asyncio event loop is never blocked by it.
- :meth:`MagpieEngine.submit` is thread-safe and returns at once with a :class:`SynthesisStream`, which yields
  int16 audio chunks as codec frames are generated (``for`` from a thread, ``async for`` from a loop).
- ``step="fast"`` (default): our own decoder step with a KV cache (:mod:`~pipecat_nemotron.tts.magpie.fast_step`,
  run by :mod:`~pipecat_nemotron.tts.magpie.runner`) decodes up to ``max_batch`` requests together, each advancing
  one codec frame per step; requests join and leave between steps (:mod:`~pipecat_nemotron.tts.magpie.policy`),
  later ones wait first-in first-out.
- ``step="nemo"``: NeMo's ``generate_speech``, one request at a time, first-in first-out
  (:mod:`~pipecat_nemotron.tts.magpie.nemo_step`; for comparison, and the fallback for a model the fast step does
  not support).
- :meth:`SynthesisStream.cancel` aborts a request: a queued one is skipped, a running one stops at its next step.
  :meth:`MagpieEngine.close` cancels them all and stops the thread.

:data:`shared_magpie_engines` (in :mod:`~pipecat_nemotron.tts.magpie.shared`) shares engines process-wide by
(model, device, codec).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from loguru import logger

from pipecat_nemotron.runtime import gil
from pipecat_nemotron.runtime.devices import resolve_device
from pipecat_nemotron.runtime.nemo_logs import quiet_nemo
from pipecat_nemotron.tts.magpie.errors import MagpieEngineError, MagpieSynthesisError
from pipecat_nemotron.tts.magpie.loading import check_model_source, check_tts_dependencies, load_magpie_model
from pipecat_nemotron.tts.magpie.options import (
    DEFAULT_MAGPIE_MODEL,
    VOICES,
    MagpieSynthesisOptions,
    normalize_language,
    normalize_voice,
)
from pipecat_nemotron.tts.magpie.scheduler import MagpieScheduler
from pipecat_nemotron.tts.magpie.stream import AudioChunk, Synthesis, SynthesisStream

# The request and error names stay importable from here (the registry is in ``magpie.shared``).
__all__ = [
    "AudioChunk",
    "MagpieEngine",
    "MagpieEngineError",
    "MagpieSynthesisError",
    "Synthesis",
    "SynthesisStream",
]


class MagpieEngine:
    """One ``MagpieTTSModel`` served by one worker thread, decoding many synthesis requests together.

    Construction validates its arguments, then loads the model on the worker thread in the background (check with
    :meth:`wait_until_ready` or ``await`` :meth:`wait_ready`). Requests submitted meanwhile wait in the queue.

    Fairness: up to ``max_batch`` requests advance together, one frame each per step; the rest are admitted
    first-in first-out as rows free up (``stats.queue_wait_s`` says how long each waited).
    """

    def __init__(
        self,
        model: str = DEFAULT_MAGPIE_MODEL,
        *,
        device: str = "auto",
        codec_model_path: str | None = None,
        decode_context_frames: int | None = None,
        stateful_codec: bool = True,
        warmup: bool = True,
        step: str = "fast",
        max_batch: int = 8,
        dtype: str = "float32",
        cuda_graphs: bool = True,
        gil_switch_interval_ms: float | None = gil.DEFAULT_SWITCH_INTERVAL_MS,
    ) -> None:
        """Validate the arguments and start loading the model on the engine's worker thread.

        Args:
            model: Hub id (default ``nvidia/magpie_tts_multilingual_357m``) or path to a ``.nemo`` file.
            device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
            codec_model_path: Codec ``.nemo`` path (or hub id) overriding the one stored in the checkpoint; needed
                for a local checkpoint whose codec was saved elsewhere.
            decode_context_frames: Without a codec state, frames of left context decoded with each audio chunk.
                None measures the codec decoder's receptive field at load time, which makes streamed audio equal
                the offline decode.
            stateful_codec: Keep each request's codec convolution history, so each chunk decodes only its new
                frames (same audio; :mod:`~pipecat_nemotron.tts.magpie.codec_stream`). A codec it does not support
                warns and re-decodes the left context; False always does.
            warmup: Synthesise a short sentence after loading so the first real request is not slowed by lazy
                initialisation.
            step: ``"fast"``: our KV-cached step with continuous batching; ``"nemo"``: NeMo's ``generate_speech``,
                one request at a time. A model the fast step does not support falls back to ``"nemo"`` (warning).
            max_batch: Requests decoded together on the fast step (each takes two rows with CFG).
            dtype: ``"float32"`` or ``"bfloat16"`` (fast step only; the codec stays fp32, sampling runs in fp32).
            cuda_graphs: On CUDA, run the fast step's decoder and local transformer as CUDA graphs per batch bucket
                (captured on first use; each capture is logged with the memory it took).
            gil_switch_interval_ms: Lower Python's thread switch interval (process-wide, never raised) to this
                many ms, so the worker's torch ops are not starved behind the event loop (:mod:`pipecat_nemotron.runtime.gil`).

        Raises:
            ImportError: NeMo's TTS collection is missing (the message names the extra to install).
            FileNotFoundError: A local checkpoint path does not exist.
            ValueError: An argument is out of range.

        """
        check_tts_dependencies(model)
        check_model_source(model, codec_model_path)
        gil.check_switch_interval(gil_switch_interval_ms)
        if decode_context_frames is not None and (
            not isinstance(decode_context_frames, int) or decode_context_frames < 0
        ):
            raise ValueError(
                f"decode_context_frames must be None or an integer >= 0, got {decode_context_frames!r}"
            )
        if not isinstance(stateful_codec, bool):
            raise ValueError(f"stateful_codec must be True or False, got {stateful_codec!r}")
        if step not in ("fast", "nemo"):
            raise ValueError(f'step must be "fast" or "nemo", got {step!r}')
        if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1:
            raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(f'dtype must be "float32" or "bfloat16", got {dtype!r}')
        if dtype != "float32" and step != "fast":
            raise ValueError(f'dtype={dtype!r} needs step="fast" (NeMo\'s step runs in float32)')
        self.model_name = model
        self.device = resolve_device(device)
        self._step = step
        self._max_batch = max_batch
        self._dtype = dtype
        self._cuda_graphs = cuda_graphs
        self.codec_model_path = codec_model_path
        self._decode_context_frames = decode_context_frames
        self._stateful_codec = stateful_codec
        self._codec_mode = ""
        self._warmup = warmup
        self._graphs: Callable[[], dict[str, Any]] | None = None

        self._model: Any = None
        self._sample_rate = 0
        self._samples_per_frame = 0
        self._load_error: BaseException | None = None
        self._ready = threading.Event()
        self._scheduler = MagpieScheduler(str(self), max_batch)
        gil.shorten_switch_interval(gil_switch_interval_ms)
        self._thread = threading.Thread(target=self._run, name=f"magpie-tts-{id(self):x}", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"MagpieEngine({self.model_name!r}, device={self.device!r}, step={self._step!r}, dtype={self._dtype!r})"

    @property
    def step(self) -> str:
        """The decoding step in use: ``"fast"`` or ``"nemo"`` (``"nemo"`` after a fallback, known once ready)."""
        return self._step

    @property
    def max_batch(self) -> int:
        """Requests decoded together on the fast step."""
        return self._max_batch

    # Readiness.

    @property
    def ready(self) -> bool:
        """Whether the model is loaded and warmed up."""
        return self._ready.is_set() and self._load_error is None

    def wait_until_ready(self, timeout: float | None = None) -> None:
        """Block until the model is loaded.

        Args:
            timeout: Seconds to wait; None waits as long as loading takes.

        Raises:
            MagpieEngineError: Loading failed (the cause is chained), or the worker thread stopped before the model
                was ready (it is checked every 0.25 s, so a dead worker never leaves a waiter hanging).
            TimeoutError: Still loading after ``timeout`` seconds.

        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ready.is_set():
            left = 0.25 if deadline is None else min(0.25, deadline - time.monotonic())
            if left <= 0:
                raise TimeoutError(f"{self}: model still loading after {timeout} s")
            if self._ready.wait(left):
                break
            if not self._thread.is_alive() and not self._ready.is_set():
                raise MagpieEngineError(
                    f"{self}: the engine's worker thread stopped before the model was loaded"
                )
        if self._load_error is not None:
            raise MagpieEngineError(f"{self}: loading failed: {self._load_error}") from self._load_error

    async def wait_ready(self) -> None:
        """Wait, without blocking the event loop, until the model is loaded (see :meth:`wait_until_ready`).

        Raises:
            MagpieEngineError: Loading failed, or the worker thread stopped before the model was loaded.

        """
        if not self._ready.is_set():
            await asyncio.to_thread(self.wait_until_ready)
        self.wait_until_ready(0)

    @property
    def load_error(self) -> BaseException | None:
        """Why loading failed (None while loading and once ready); a failed engine serves no request."""
        return self._load_error

    @property
    def model(self) -> Any:
        """The loaded ``MagpieTTSModel`` (None until ready). Only the worker thread may run it."""
        return self._model

    @property
    def sample_rate(self) -> int:
        """Output sample rate of the codec, in Hz (read from the model; 0 until ready)."""
        return self._sample_rate

    @property
    def samples_per_frame(self) -> int:
        """Audio samples per codec frame (0 until ready)."""
        return self._samples_per_frame

    @property
    def decode_context_frames(self) -> int | None:
        """Left-context frames decoded with each chunk (0 with codec states; None: the whole prefix), once ready."""
        return self._decode_context_frames

    @property
    def pending(self) -> int:
        """Requests waiting for a row (not counting the running ones)."""
        return self._scheduler.pending

    @property
    def busy(self) -> bool:
        """Whether a request is being synthesised right now."""
        return self._scheduler.active > 0

    @property
    def steps(self) -> int:
        """Decoder steps the fast step ran (0 on NeMo's step)."""
        return self._scheduler.steps

    @property
    def prefills(self) -> int:
        """Batched prefill calls of the fast step (one per group of rows starting a text chunk)."""
        return self._scheduler.prefills

    # Requests.

    def submit(
        self,
        text: str,
        *,
        voice: str = "aria",
        language: str = "en",
        options: MagpieSynthesisOptions | None = None,
    ) -> SynthesisStream:
        """Queue ``text`` for synthesis and return its stream at once (thread-safe, never blocks).

        Args:
            text: Text to speak (long text is split into sentences, as NeMo's ``do_tts`` does).
            voice: One of ``john``, ``sofia``, ``aria``, ``jason``, ``leo``.
            language: One of ``en``, ``es``, ``de``, ``fr``, ``it``, ``vi``, ``zh`` (regional variants accepted).
            options: Per-request options; defaults to ``MagpieSynthesisOptions()``.

        Returns:
            The request's :class:`SynthesisStream`.

        Raises:
            ValueError: Unknown voice or language.
            MagpieEngineError: The engine is closed, or its worker thread stopped.

        """
        voice = normalize_voice(voice)
        language = normalize_language(language)
        stream = SynthesisStream(
            Synthesis(
                text=text,
                speaker_index=VOICES[voice],
                language=language,
                options=options or MagpieSynthesisOptions(),
            )
        )
        self._scheduler.submit(stream)
        return stream

    # Lifetime.

    def close(self, timeout: float | None = 10.0) -> None:
        """Cancel all requests, stop the worker thread and free the model. Idempotent.

        Args:
            timeout: Seconds to wait for the worker to stop (it stops within one codec frame once loaded).

        """
        self._scheduler.close()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._scheduler.closed

    @property
    def serving(self) -> bool:
        """Whether the engine takes requests: not closed, and its worker has not stopped (it may still be loading)."""
        return not self._scheduler.closed and not self._scheduler.stopped

    # Worker thread (the only one that runs the model).

    def _run(self) -> None:
        try:
            with quiet_nemo(logging.WARNING):
                try:
                    self._load()
                except BaseException as e:  # Reported to every waiter; the thread then fails every request.
                    self._load_error = e
                    logger.error(f"{self}: loading failed: {e}")
                finally:
                    self._ready.set()
                if self._load_error is None:
                    self._scheduler.serve()
                else:
                    self._scheduler.refuse(MagpieEngineError(f"{self}: model failed to load: {self._load_error}"))
        finally:  # However the thread ends, no request waits for it.
            self._scheduler.stop(MagpieEngineError(f"{self}: the engine's worker thread stopped"))
            self._model = None
            with contextlib.suppress(Exception):
                import torch

                if torch.cuda.is_available():
                    torch.cuda.empty_cache()

    def _load(self) -> None:
        from pipecat_nemotron.runtime.nemo_loading import wait_for_nemo_imports

        wait_for_nemo_imports()  # an ASR service may be importing NeMo on another thread
        from pipecat_nemotron.tts.magpie import _nemo_private
        from pipecat_nemotron.tts.magpie.codec_stream import CodecDecoding

        started = time.perf_counter()
        model = load_magpie_model(self.model_name, self.device, self.codec_model_path)
        _nemo_private.check_compatibility(model)
        if model.num_baked_speakers < len(VOICES):
            raise MagpieEngineError(
                f"{self.model_name!r} has {model.num_baked_speakers} baked speakers; Magpie voices "
                f"{', '.join(VOICES)} need {len(VOICES)}"
            )
        self._model = model
        self._sample_rate = int(model.output_sample_rate)
        self._samples_per_frame = int(model.codec_model_samples_per_frame)
        codec = CodecDecoding(
            model, stateful=self._stateful_codec, context_frames=self._decode_context_frames, name=str(self)
        )
        self._decode_context_frames = codec.context_frames
        self._codec_mode = "states" if codec.streaming is not None else f"context {codec.context_frames} frames"
        self._bind_step(model, codec)
        if self._warmup:
            warm = SynthesisStream(
                Synthesis("Hello.", 0, "en", MagpieSynthesisOptions(max_duration_s=0.2), internal=True)
            )
            self._scheduler.run_alone(warm)
            if warm.error is not None:
                raise MagpieEngineError(f"warm-up synthesis failed: {warm.error}") from warm.error
        logger.info(
            f"{self}: ready in {time.perf_counter() - started:.1f} s ({self._sample_rate} Hz, "
            f"{self._samples_per_frame} samples/frame, codec {self._codec_mode})"
        )

    def _bind_step(self, model: Any, codec: Any) -> None:
        """Serve with the fast step, or NeMo's (with a warning when the fast step does not support the model)."""
        from pipecat_nemotron.tts.magpie.fast_step import unsupported_reason

        if self._step == "fast":
            reason = unsupported_reason(model)
            if reason is not None:
                logger.warning(f"{self}: the fast Magpie step does not support {reason}; using NeMo's step")
                self._step = "nemo"
        if self._step == "nemo":
            from pipecat_nemotron.tts.magpie.nemo_step import NemoStep

            self._scheduler.name = str(self)
            self._scheduler.bind_whole(NemoStep(model, codec))
            return
        from pipecat_nemotron.tts.magpie.runner import MagpieRunner

        if self._dtype == "bfloat16":
            import torch

            from pipecat_nemotron.tts.magpie.graphs import cast_for_fast_step

            cast_for_fast_step(model, torch.bfloat16)
        runner = MagpieRunner(model, codec, max_batch=self._max_batch, cuda_graphs=self._cuda_graphs)
        self._graphs = runner.describe_graphs
        self._scheduler.bind(runner)

    @property
    def graphs(self) -> dict[str, Any]:
        """What the fast step captured as CUDA graphs (empty when none: CPU, NeMo's step, or disabled)."""
        return self._graphs() if self._graphs is not None else {}
