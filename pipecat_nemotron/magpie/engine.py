"""The Magpie TTS engine: one loaded ``MagpieTTSModel``, one worker thread, a FIFO queue of synthesis requests.

Threading model:

- The engine's worker thread owns the model. It loads it, warms it up, then takes requests from a FIFO queue and
  synthesises them one at a time. Nothing else touches the model, so callers never block on it and an asyncio event
  loop is never blocked by it.
- :meth:`MagpieEngine.submit` is thread-safe and returns at once with a :class:`SynthesisStream`, which yields
  int16 audio chunks as codec frames are generated (iterate it with ``for`` from a thread, or ``async for`` from a
  loop).
- :meth:`SynthesisStream.cancel` aborts a request: a queued one is skipped, a running one stops at its next codec
  frame (NeMo's decoding loop is left by raising from the per-frame hook), and the worker moves on to the next
  request.

Several Pipecat sessions (or ``MagpieTTSService`` instances) can share one engine: requests are served strictly in
the order they were submitted, one at a time, so a long sentence from one session delays the next session's first
audio by its remaining synthesis time. :data:`shared_magpie_engines` shares engines process-wide by
(model, device, codec).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import queue
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from loguru import logger

from pipecat_nemotron.magpie.loading import (
    check_model_source,
    check_tts_dependencies,
    load_magpie_model,
    quiet_nemo_logging,
    resolve_device,
)
from pipecat_nemotron.magpie.options import (
    DEFAULT_MAGPIE_MODEL,
    VOICES,
    MagpieSynthesisOptions,
    normalize_language,
    normalize_voice,
)


class MagpieSynthesisError(RuntimeError):
    """A synthesis request failed inside the engine (the engine itself keeps serving)."""


class MagpieEngineError(RuntimeError):
    """The engine could not load its model, or was closed."""


@dataclass(frozen=True)
class AudioChunk:
    """A piece of synthesised speech.

    Attributes:
        audio: Mono int16 PCM samples.
        sample_rate: Sample rate of ``audio``, in Hz (the codec's output rate).
        first_frame: Index of the first codec frame in this chunk, counted from the start of the request.
        num_frames: Codec frames in this chunk.

    """

    audio: np.ndarray
    sample_rate: int
    first_frame: int
    num_frames: int

    @property
    def duration_s(self) -> float:
        """Duration of the chunk, in seconds."""
        return len(self.audio) / self.sample_rate


_END = object()


class _Abort(Exception):
    """Raised from the frame hook to leave NeMo's decoding loop (cancelled, or the frame budget is spent)."""


@dataclass
class _Request:
    text: str
    speaker_index: int
    language: str
    options: MagpieSynthesisOptions
    internal: bool = False  # The warm-up request: no truncation warning.


@dataclass
class SynthesisStats:
    """Timings and counts of one request, filled in by the worker thread.

    Attributes:
        submitted_at: ``time.perf_counter()`` when the request was submitted.
        started_at: When the worker started it (None while queued or if skipped).
        first_audio_at: When its first audio chunk was ready.
        finished_at: When it ended, whatever the outcome.
        frames: Codec frames kept (decoded to audio).
        chunks: Audio chunks emitted.

    """

    submitted_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None
    first_audio_at: float | None = None
    finished_at: float | None = None
    frames: int = 0
    chunks: int = 0

    @property
    def queue_wait_s(self) -> float | None:
        """Seconds spent queued behind other requests."""
        return None if self.started_at is None else self.started_at - self.submitted_at

    @property
    def time_to_first_audio_s(self) -> float | None:
        """Seconds from submission to the first audio chunk (includes queueing)."""
        return None if self.first_audio_at is None else self.first_audio_at - self.submitted_at


class SynthesisStream:
    """Handle on one synthesis request: iterate it for audio chunks, cancel it to stop.

    ``status`` moves from ``"queued"`` to ``"running"`` to one of ``"completed"`` (the model ended the speech),
    ``"truncated"`` (``max_duration_s`` reached), ``"cancelled"`` or ``"failed"``. Iteration ends after the last
    chunk; for a failed request it raises :class:`MagpieSynthesisError`. Consume a stream from one place only.
    """

    _ids = itertools.count(1)

    def __init__(self, request: _Request) -> None:
        self.id = next(self._ids)
        self.stats = SynthesisStats()
        self._request = request
        self._cancel = threading.Event()
        self._status = "queued"
        self._error: BaseException | None = None
        self._items: collections.deque[Any] = collections.deque()
        self._cond = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None

    def __repr__(self) -> str:
        return f"SynthesisStream#{self.id}({self._status})"

    @property
    def status(self) -> str:
        """``"queued"``, ``"running"``, ``"completed"``, ``"truncated"``, ``"cancelled"`` or ``"failed"``."""
        return self._status

    @property
    def done(self) -> bool:
        """Whether the request has ended (its last chunk may still be unread)."""
        return self._status in ("completed", "truncated", "cancelled", "failed")

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called."""
        return self._cancel.is_set()

    def cancel(self) -> None:
        """Stop the request: skipped if still queued, stopped at its next codec frame if running. Idempotent."""
        self._cancel.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the request has ended; return whether it has. Does not consume chunks."""
        with self._cond:
            return self._cond.wait_for(lambda: self.done, timeout)

    # Worker side.

    def _put(self, item: Any) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify_all()
            loop, wakeup = self._loop, self._wakeup
        if loop is not None and wakeup is not None:
            with contextlib.suppress(RuntimeError):  # The consumer's loop has closed: nobody is listening.
                loop.call_soon_threadsafe(wakeup.set)

    def _finish(self, status: str, error: BaseException | None = None) -> None:
        self.stats.finished_at = time.perf_counter()
        with self._cond:
            self._status = status
            self._error = error
        self._put(_END)

    # Consumer side.

    def _pop(self) -> Any:
        item = self._items.popleft()
        if item is _END:
            self._items.appendleft(_END)  # Stay ended for repeated iteration.
            if self._error is not None:
                raise MagpieSynthesisError(f"Magpie synthesis failed: {self._error}") from self._error
            raise StopIteration
        return item

    def __iter__(self) -> Iterator[AudioChunk]:
        return self

    def __next__(self) -> AudioChunk:
        with self._cond:
            self._cond.wait_for(lambda: bool(self._items))
            return self._pop()

    def __aiter__(self) -> AsyncIterator[AudioChunk]:
        return self

    async def __anext__(self) -> AudioChunk:
        while True:
            with self._cond:
                if self._items:
                    try:
                        return self._pop()
                    except StopIteration:
                        raise StopAsyncIteration from None
                if self._wakeup is None:
                    self._loop = asyncio.get_running_loop()
                    self._wakeup = asyncio.Event()
                self._wakeup.clear()
                wakeup = self._wakeup
            await wakeup.wait()


class MagpieEngine:
    """One ``MagpieTTSModel`` served by one worker thread, with a FIFO queue of synthesis requests.

    Construction validates its arguments, then loads the model on the worker thread in the background (check with
    :meth:`wait_until_ready` or ``await`` :meth:`wait_ready`). Requests submitted meanwhile wait in the queue.

    Fairness: requests are served first-in first-out, one at a time, whoever submitted them. Use
    :data:`shared_magpie_engines` (or pass one engine around) to share a model between services in the process.
    """

    def __init__(
        self,
        model: str = DEFAULT_MAGPIE_MODEL,
        *,
        device: str = "auto",
        codec_model_path: str | None = None,
        decode_context_frames: int | None = None,
        warmup: bool = True,
    ) -> None:
        """Validate the arguments and start loading the model on the engine's worker thread.

        Args:
            model: Hub id (default ``nvidia/magpie_tts_multilingual_357m``) or path to a ``.nemo`` file.
            device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
            codec_model_path: Codec ``.nemo`` path (or hub id) overriding the one stored in the checkpoint; needed
                for a local checkpoint whose codec was saved elsewhere.
            decode_context_frames: Frames of left context decoded with each audio chunk. None measures the codec
                decoder's receptive field at load time, which makes streamed audio equal the offline decode.
            warmup: Synthesise a short sentence after loading so the first real request is not slowed by lazy
                initialisation.

        Raises:
            ImportError: NeMo's TTS collection is missing (the message names the extra to install).
            FileNotFoundError: A local checkpoint path does not exist.
            ValueError: An argument is out of range.

        """
        check_tts_dependencies(model)
        check_model_source(model, codec_model_path)
        if decode_context_frames is not None and (
            not isinstance(decode_context_frames, int) or decode_context_frames < 0
        ):
            raise ValueError(
                f"decode_context_frames must be None or an integer >= 0, got {decode_context_frames!r}"
            )
        self.model_name = model
        self.device = resolve_device(device)
        self.codec_model_path = codec_model_path
        self._decode_context_frames = decode_context_frames
        self._warmup = warmup

        self._model: Any = None
        self._sample_rate = 0
        self._samples_per_frame = 0
        self._load_error: BaseException | None = None
        self._ready = threading.Event()
        self._closed = False
        # Orders submit() against close(), so nothing is queued behind the worker's stop sentinel.
        self._submit_lock = threading.Lock()
        self._jobs: queue.Queue[SynthesisStream | None] = queue.Queue()
        self._current: SynthesisStream | None = None
        self._thread = threading.Thread(target=self._run, name=f"magpie-tts-{id(self):x}", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"MagpieEngine({self.model_name!r}, device={self.device!r})"

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
            MagpieEngineError: Loading failed (the cause is chained) or the engine was closed.
            TimeoutError: Still loading after ``timeout`` seconds.

        """
        if not self._ready.wait(timeout):
            raise TimeoutError(f"{self}: model still loading after {timeout} s")
        if self._load_error is not None:
            raise MagpieEngineError(f"{self}: loading failed: {self._load_error}") from self._load_error

    async def wait_ready(self) -> None:
        """Wait, without blocking the event loop, until the model is loaded (see :meth:`wait_until_ready`)."""
        if not self._ready.is_set():
            await asyncio.to_thread(self._ready.wait)
        self.wait_until_ready(0)

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
        """Left-context frames decoded with each chunk (None: the whole prefix), known once ready."""
        return self._decode_context_frames

    @property
    def pending(self) -> int:
        """Requests waiting in the queue (not counting the running one)."""
        return self._jobs.qsize()

    @property
    def busy(self) -> bool:
        """Whether a request is being synthesised right now."""
        return self._current is not None

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
            MagpieEngineError: The engine is closed.

        """
        voice = normalize_voice(voice)
        language = normalize_language(language)
        request = _Request(
            text=text,
            speaker_index=VOICES[voice],
            language=language,
            options=options or MagpieSynthesisOptions(),
        )
        stream = SynthesisStream(request)
        with self._submit_lock:
            if self._closed:
                raise MagpieEngineError(f"{self} is closed")
            self._jobs.put(stream)
        return stream

    # Lifetime.

    def close(self, timeout: float | None = 10.0) -> None:
        """Cancel all requests, stop the worker thread and free the model. Idempotent.

        Args:
            timeout: Seconds to wait for the worker to stop (it stops within one codec frame once loaded).

        """
        with self._submit_lock:
            if self._closed:
                return
            self._closed = True
            self._jobs.put(None)
        current = self._current
        if current is not None:
            current.cancel()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    # Worker thread.

    def _run(self) -> None:
        with quiet_nemo_logging():
            try:
                self._load()
            except BaseException as e:  # Reported to every waiter; the thread then drains the queue.
                self._load_error = e
                logger.error(f"{self}: loading failed: {e}")
            finally:
                self._ready.set()
            self._serve()
            self._model = None
            with contextlib.suppress(Exception):
                import torch

                if torch.cuda.is_available():
                    torch.cuda.empty_cache()

    def _load(self) -> None:
        from pipecat_nemotron.engine.loading import wait_for_nemo_imports

        wait_for_nemo_imports()  # an ASR service may be importing NeMo on another thread
        from pipecat_nemotron.magpie import _nemo_private
        from pipecat_nemotron.magpie.streaming import measure_decoder_context

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
        if self._decode_context_frames is None:
            probe = measure_decoder_context(
                self._decode,
                num_codebooks=model.num_audio_codebooks,
                codebook_size=model.codebook_size,
                samples_per_frame=self._samples_per_frame,
                device=next(model.parameters()).device,
            )
            self._decode_context_frames = probe.context_frames
            if not probe.causal:
                logger.warning(
                    f"{self}: the codec decoder is not causal; streamed audio differs slightly from an offline "
                    "decode at chunk boundaries"
                )
            if probe.context_frames is None:
                logger.warning(
                    f"{self}: could not bound the codec decoder's receptive field; each audio chunk decodes the "
                    "whole prefix (exact, but slower on long sentences). Set decode_context_frames to bound it."
                )
        if self._warmup:
            warm = SynthesisStream(
                _Request("Hello.", 0, "en", MagpieSynthesisOptions(max_duration_s=0.2), internal=True)
            )
            _, error = self._synthesize(warm)
            if error is not None:
                raise MagpieEngineError(f"warm-up synthesis failed: {error}") from error
        logger.info(
            f"{self}: ready in {time.perf_counter() - started:.1f} s ({self._sample_rate} Hz, "
            f"{self._samples_per_frame} samples/frame, decode context {self._decode_context_frames} frames)"
        )

    def _serve(self) -> None:
        while True:
            stream = self._jobs.get()
            if stream is None:
                break
            if self._load_error is not None:
                stream._finish(
                    "failed", MagpieEngineError(f"{self}: model failed to load: {self._load_error}")
                )
            elif stream.cancelled or self._closed:
                stream._finish("cancelled")
            else:
                self._current = stream
                try:
                    status, error = self._synthesize(stream)
                finally:
                    self._current = None
                stream._finish(status, error)
        # Closed: whatever is still queued ends cancelled.
        while True:
            try:
                stream = self._jobs.get_nowait()
            except queue.Empty:
                break
            if stream is not None:
                stream._finish("cancelled")

    def _decode(self, codes: Any) -> Any:
        from pipecat_nemotron.magpie._nemo_private import codes_to_audio

        return codes_to_audio(self._model, codes)

    def _synthesize(self, stream: SynthesisStream) -> tuple[str, BaseException | None]:
        """Run one request on the worker thread, streaming its chunks; return its final status and error."""
        import torch
        from nemo.collections.tts.parts.utils.tts_dataset_utils import (
            chunk_text_for_inference,
            get_tokenizer_for_language,
        )

        from pipecat_nemotron.magpie._nemo_private import frame_hook
        from pipecat_nemotron.magpie.streaming import StreamingDecoder

        model = self._model
        request = stream._request
        options = request.options
        stats = stream.stats
        stats.started_at = time.perf_counter()
        stream._status = "running"
        max_frames = options.max_frames(self._sample_rate, self._samples_per_frame)
        decoder = StreamingDecoder(
            self._decode,
            samples_per_frame=self._samples_per_frame,
            context_frames=self._decode_context_frames,
            first_chunk_frames=options.first_chunk_frames,
            chunk_frames=options.chunk_frames,
        )

        def emit(audio: np.ndarray | None) -> None:
            if audio is None:
                return
            num_frames = len(audio) // self._samples_per_frame
            first_frame = decoder.emitted_frames - num_frames
            if stats.first_audio_at is None:
                stats.first_audio_at = time.perf_counter()
            stats.chunks += 1
            stream._put(AudioChunk(audio, self._sample_rate, first_frame, num_frames))

        def on_frames(frames: torch.Tensor) -> None:
            if stream.cancelled:
                raise _Abort("cancelled")
            for i in range(frames.shape[-1]):
                frame = frames[:, i]
                if bool((frame >= model.codebook_size).any()):
                    continue  # Special tokens (end of speech) carry no audio.
                stats.frames += 1
                emit(decoder.push(frame))
                if stats.frames >= max_frames:
                    raise _Abort("truncated")

        status = "completed"
        try:
            tokenizer_name = get_tokenizer_for_language(
                request.language, list(model.tokenizer.tokenizers.keys())
            )
            chunks, chunk_lens, _ = chunk_text_for_inference(
                text=request.text,
                language=request.language,
                tokenizer_name=tokenizer_name,
                text_tokenizer=model.tokenizer,
                eos_token_id=model.eos_id,
            )
            use_local_transformer = str(getattr(model.local_transformer_type, "value", "none")) != "none"
            device = next(model.parameters()).device
            with torch.inference_mode(), frame_hook(model, on_frames):
                chunk_state = model.create_chunk_state(batch_size=1)
                for index, (tokens, tokens_len) in enumerate(zip(chunks, chunk_lens, strict=True)):
                    batch = {
                        "text": tokens.unsqueeze(0).to(device),
                        "text_lens": torch.tensor([tokens_len], device=device, dtype=torch.long),
                        "speaker_indices": request.speaker_index,
                    }
                    model.generate_speech(
                        batch,
                        chunk_state=chunk_state,
                        end_of_text=[index == len(chunks) - 1],
                        beginning_of_text=index == 0,
                        use_cfg=options.use_cfg,
                        use_local_transformer_for_inference=use_local_transformer,
                    )
        except _Abort as abort:
            status = str(abort)
        except Exception as e:
            logger.opt(exception=e).error(f"{self}: synthesis #{stream.id} failed: {e}")
            return "failed", e
        if status == "cancelled":
            return status, None
        try:
            with torch.inference_mode():
                emit(decoder.flush())
        except Exception as e:
            logger.opt(exception=e).error(f"{self}: decoding #{stream.id} failed: {e}")
            return "failed", e
        if status == "truncated" and not request.internal:
            logger.warning(
                f"{self}: synthesis #{stream.id} stopped at max_duration_s={options.max_duration_s} "
                "without the model ending the speech"
            )
        return status, None


_EngineKey = tuple[str, str, str | None]


class SharedMagpieEngines:
    """Ref-counted engines keyed by (model, device, codec): services naming the same ones share one loaded model.

    An engine stays loaded when its last user releases it (a bot server keeps serving sessions without reloading),
    unless ``unload_when_unused`` is set; :meth:`close_all` stops every engine at process shutdown. Thread-safe.
    """

    def __init__(self, unload_when_unused: bool = False) -> None:
        """Create an empty registry.

        Args:
            unload_when_unused: Close an engine (freeing its model) when its last user releases it.

        """
        self.unload_when_unused = unload_when_unused
        self._lock = threading.Lock()
        self._engines: dict[_EngineKey, MagpieEngine] = {}
        self._refs: dict[int, int] = {}
        # Engines loaded by :meth:`preload`: each holds one reference for the life of the process.
        self._pinned: set[int] = set()

    def acquire(
        self,
        model: str = DEFAULT_MAGPIE_MODEL,
        *,
        device: str = "auto",
        codec_model_path: str | None = None,
        **engine_kwargs: Any,
    ) -> MagpieEngine:
        """Return the engine for (model, device, codec), creating it (and starting its load) on first use.

        Call :meth:`release` once per acquire. An engine whose load failed is replaced on the next acquire.

        Args:
            model: Hub id or ``.nemo`` path.
            device: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (``"auto"`` is resolved before lookup).
            codec_model_path: Optional codec override (part of the key).
            **engine_kwargs: Further :class:`MagpieEngine` arguments, used only when the engine is created.

        Returns:
            The shared engine (possibly still loading: see :meth:`MagpieEngine.wait_ready`).

        """
        key = (model, resolve_device(device), codec_model_path)
        with self._lock:
            engine = self._engines.get(key)
            if engine is None or engine.closed or engine._load_error is not None:
                engine = MagpieEngine(
                    model, device=key[1], codec_model_path=codec_model_path, **engine_kwargs
                )
                self._engines[key] = engine
            self._refs[id(engine)] = self._refs.get(id(engine), 0) + 1
            return engine

    async def preload(
        self,
        model: str = DEFAULT_MAGPIE_MODEL,
        *,
        device: str = "auto",
        codec_model_path: str | None = None,
        **engine_kwargs: Any,
    ) -> MagpieEngine:
        """Load and warm up the engine for (model, device, codec) now and keep it loaded for the process.

        Call it at process start so no session waits for the model (``MagpieTTSService.start`` waits for a
        loading model, and Pipecat gives a pipeline's ``StartFrame`` only 20 s). Arguments as :meth:`acquire`.

        Raises:
            MagpieEngineError: Loading failed (the cause is chained).

        """
        started = time.perf_counter()
        logger.info(f"Loading the Magpie TTS model {model} ({device}) at process start...")
        engine = self.acquire(model, device=device, codec_model_path=codec_model_path, **engine_kwargs)
        try:
            await engine.wait_ready()
        except BaseException:
            self.release(engine)
            raise
        with self._lock:
            if id(engine) in self._pinned:
                self._refs[id(engine)] -= 1  # one process-lifetime reference is enough
            self._pinned.add(id(engine))
        logger.info(f"Magpie TTS model {model} ready after {time.perf_counter() - started:.1f} s")
        return engine

    def release(self, engine: MagpieEngine) -> None:
        """Drop one reference to ``engine``; at zero, close it if ``unload_when_unused`` (or if it was replaced)."""
        with self._lock:
            refs = self._refs.get(id(engine), 0) - 1
            if refs > 0:
                self._refs[id(engine)] = refs
                return
            self._refs.pop(id(engine), None)
            registered = engine in self._engines.values()
            if registered and not self.unload_when_unused:
                return
            for key in [k for k, e in self._engines.items() if e is engine]:
                del self._engines[key]
        engine.close()

    def refs(self, engine: MagpieEngine) -> int:
        """Current users of ``engine``."""
        with self._lock:
            return self._refs.get(id(engine), 0)

    def close_all(self) -> None:
        """Close every engine (process shutdown)."""
        with self._lock:
            engines = list(self._engines.values())
            self._engines.clear()
            self._refs.clear()
            self._pinned.clear()
        for engine in engines:
            engine.close()


shared_magpie_engines = SharedMagpieEngines()
"""The registry ``MagpieTTSService`` uses."""
