"""``NemotronEngine``: one loaded model, many concurrent streams, continuous batching."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
from loguru import logger

from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE, SAMPLES_PER_MS
from pipecat_nemotron.asr.config import EngineConfig
from pipecat_nemotron.asr.errors import CapacityError, EngineNotRunningError
from pipecat_nemotron.asr.scheduler import Scheduler, StepStats
from pipecat_nemotron.asr.splits import join_forced_finals
from pipecat_nemotron.asr.state import StreamState
from pipecat_nemotron.asr.stream import ASRStream
from pipecat_nemotron.asr.stream_rules import StreamRules
from pipecat_nemotron.asr.types import EngineInfo, Transcript
from pipecat_nemotron.runtime.gil import shorten_switch_interval
from pipecat_nemotron.runtime.stats import percentile

if TYPE_CHECKING:
    import torch

    from pipecat_nemotron.asr.runner import ModelRunner

#: ``hook(stream_ids, encoded [B, D, T], encoded_len [B])``, see :meth:`NemotronEngine.observe_encoder_output`.
EncoderOutputHook = Callable[[list[int], "torch.Tensor", "torch.Tensor"], None]

#: Duration of the warm-up clip per latency mode, seconds.
_WARMUP_SECONDS = 1.5


class NemotronEngine:
    """Cache-aware streaming ASR for many concurrent streams on one copy of the model.

    Example::

        engine = NemotronEngine(EngineConfig(model="nvidia/nemotron-speech-streaming-en-0.6b"))
        await engine.start()
        stream = engine.open_stream(latency_ms=160)
        await stream.push(pcm16_bytes, sample_rate=16000)
        final = await stream.finalize()
        await stream.close()
        await engine.stop()

    One scheduler task owns the model: every step takes the ready chunks of all streams (up to
    ``max_batch_size``) and runs one batched cache-aware forward per latency mode on a dedicated worker
    thread, so the event loop never blocks on the model.

    Args:
        config: Init-only settings (validated on construction).

    """

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        self._executor: ThreadPoolExecutor | None = None
        self._scheduler: Scheduler | None = None
        self._runner: ModelRunner | None = None
        self._rules: StreamRules | None = None
        self._ids = itertools.count(1)
        self._info: EngineInfo | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._start_lock: asyncio.Lock | None = None
        #: torch intra-op threads of the model thread on CPU (0 on CUDA, or before ``start()``).
        self._cpu_threads = 0

    # ---- lifecycle ----------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True between a successful ``start()`` and ``stop()``."""
        return self._scheduler is not None

    @property
    def info(self) -> EngineInfo:
        """Facts about the loaded model (after ``start()``)."""
        if self._info is None:
            raise EngineNotRunningError("the engine has not been started; call `await engine.start()`")
        if self._runner is not None and self._runner.device.type == "cuda":
            return dataclasses.replace(self._info, gpu_path=self._runner.describe_gpu_path())
        return self._info

    @property
    def error(self) -> BaseException | None:
        """What crashed the scheduler (the engine then refuses new streams), or None while it is healthy or stopped.

        Health checks read it: a server's liveness is ``engine.error is None``.
        """
        return self._scheduler.error if self._scheduler is not None else None

    @property
    def model(self) -> Any:
        """The loaded NeMo model (None before ``start()``).

        The engine's worker thread owns it: read it, or run it only while no stream is being decoded (tests use
        it to decode a clip offline for reference), and leave the encoder's attention context as found.
        """
        return self._runner.model if self._runner is not None else None

    def _load(self) -> tuple[Any, int]:
        """The model's runner and its torch CPU threads (0 on a GPU), built on the worker thread.

        ``FakeEngine`` (``asr.fake_runner``) overrides it to run the scheduler on a scripted runner.
        """
        # NeMo's loaders are imported when a model loads, not with the engine.
        from pipecat_nemotron.asr.loading import load_runner

        return load_runner(self.config)

    async def start(self) -> None:
        """Load the model (off the event loop), warm it up and start the scheduler. Idempotent.

        Raises:
            ModelLoadError: The model is missing, corrupt or cannot stream.

        """
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._scheduler is not None:
                return
            self._loop = asyncio.get_running_loop()
            shorten_switch_interval(self.config.gil_switch_interval_ms)
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nemotron-asr")
            t0 = time.perf_counter()
            try:
                self._runner, self._cpu_threads = await self._loop.run_in_executor(self._executor, self._load)
            except BaseException:
                self._executor.shutdown(wait=False)
                self._executor = None
                raise
            load_s = time.perf_counter() - t0
            runner = self._runner
            self._rules = StreamRules(self.config, runner)
            self._info = EngineInfo(
                model=self.config.model,
                device=str(runner.device),
                dtype=str(runner.dtype).replace("torch.", ""),
                latency_modes=tuple(sorted(runner.modes)),
                languages=self._rules.languages,
                cache_bytes_per_stream=runner.slot_bytes,
                max_streams=self.config.max_streams,
                load_seconds=load_s,
                encoder_step=runner.encoder_step,
                eou=self._rules.has_eou,
            )
            self._scheduler = Scheduler(
                runner,
                self._executor,
                self.config.max_batch_size,
                self.config.finalize_mode == "hard",
                self.config.max_utterance_s,
            )
            self._scheduler.start()
            if self.config.warmup:
                await self._warmup()
            logger.info(
                f"Nemotron ASR engine ready: {self.config.model} on {self._info.device} ({self._info.dtype}), "
                f"modes {list(self._info.latency_modes)} ms, "
                f"{'languages ' + ', '.join(self._info.languages) if self._info.languages else 'English'}, "
                f"{self.config.max_streams} slots of "
                f"{runner.slot_bytes / 1e6:.2f} MB, {runner.encoder_step} encoder step"
                f"{f', {self._cpu_threads} CPU threads' if self._cpu_threads else ''}, loaded in {load_s:.1f} s"
            )
            if runner.device.type == "cuda":
                logger.info(f"Nemotron ASR GPU path after warm-up: {runner.describe_gpu_path()}")

    async def _warmup(self) -> None:
        rng = np.random.default_rng(0)
        clip = (rng.standard_normal(int(MODEL_SAMPLE_RATE * _WARMUP_SECONDS)) * 0.01).astype(np.float32)
        modes = sorted(self._require().runner.modes)
        slots = min(len(modes), self.config.max_streams)
        for start in range(0, len(modes), slots):
            streams = [self.open_stream(latency_ms=m) for m in modes[start : start + slots]]
            for s in streams:
                await s.push(clip)
            await asyncio.gather(*(s.finalize() for s in streams))
            for s in streams:
                await s.close()

    async def stop(self) -> None:
        """Stop the scheduler, close every stream and release the model thread. Idempotent.

        A stop during :meth:`start` waits for the load (and warm-up) to end first: the model thread cannot be
        interrupted, and releasing it under a running load would leave ``start`` without its executor.
        """
        if self._start_lock is not None and self._start_lock.locked():
            async with self._start_lock:
                pass
        if self._scheduler is not None:
            await self._scheduler.stop()
            self._scheduler = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._runner is not None and self._runner.boost is not None:
            self._runner.boost.close()
        logger.info("Nemotron ASR engine stopped")

    async def __aenter__(self) -> NemotronEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---- streams ------------------------------------------------------------------------------------------

    @property
    def open_streams(self) -> int:
        """Streams holding a slot (opened and not yet fully closed)."""
        return len(self._scheduler.streams) if self._scheduler is not None else 0

    @property
    def steps(self) -> int:
        """Model steps run so far."""
        return self._scheduler.steps if self._scheduler is not None else 0

    @property
    def free_slots(self) -> int:
        """Cache slots no stream holds (``max_streams`` once every closed stream's slot is freed; 0 before start).

        A stream takes its slot at its first model step; a closed stream's slot is freed at the next step.
        """
        return self._runner.slots.free_slots.qsize() if self._runner is not None else 0

    @property
    def boost_trees(self) -> tuple[int, int]:
        """``(trees in the decoder now, trees built since start)``: one tree per ``(phrases, alpha)`` in use.

        Built at the first step of the first stream using the list, removed at the end of the step that saw the
        last one close or change list.
        """
        boost = self._runner.boost if self._runner is not None else None
        return (boost.active, boost.builds) if boost is not None else (0, 0)

    @property
    def hop_samples(self) -> int:
        """Samples (16 kHz) per mel frame."""
        return self._runner.frontend.hop if self._runner is not None else 160

    def finalize_ms_percentile(self, q: float = 99.0) -> float | None:
        """Percentile ``q`` of recent time-to-final values (ms), or None before any final."""
        if self._scheduler is None or not self._scheduler.recent_ttf_ms:
            return None
        return percentile(list(self._scheduler.recent_ttf_ms), q)

    def chunk_ms(self, latency_ms: int) -> float:
        """Audio per regular step in a latency mode, ms."""
        runner = self._require().runner
        return runner.shape(latency_ms).chunk_frames * runner.frontend.hop / SAMPLES_PER_MS

    def add_step_listener(self, listener: Callable[[StepStats], None]) -> None:
        """Call ``listener`` after every step (benchmarks, metrics). It runs on the event loop: keep it cheap.

        Raises:
            EngineNotRunningError: The engine is not running.

        """
        self._require().step_listeners.append(listener)

    def remove_step_listener(self, listener: Callable[[StepStats], None]) -> None:
        """Stop calling ``listener`` (a no-op if it is not registered or the engine has stopped)."""
        if self._scheduler is not None and listener in self._scheduler.step_listeners:
            self._scheduler.step_listeners.remove(listener)

    @contextlib.contextmanager
    def observe_encoder_output(self, hook: EncoderOutputHook) -> Iterator[None]:
        """Call ``hook(stream_ids, encoded, encoded_len)`` after every batched encoder forward inside the block.

        ``encoded`` is the encoder output of the forward's streams, ``[batch, features, encoder frames]`` (one
        encoder frame is 80 ms; on a multilingual model, after each stream's language prompt: what the decoder
        sees), ``encoded_len`` its valid frames per stream; row ``i`` belongs to stream
        ``stream_ids[i]``. For tests and diagnostics: the hook runs on the model's worker thread inside the step
        (keep it cheap, copy what it keeps), and an exception it raises fails that forward's streams as a model
        error would (each stream is retried alone, so only the streams it raises for fail).

        Raises:
            EngineNotRunningError: The engine is not running.

        """
        runner = self._require().runner
        previous = runner.encoder_output_hook
        runner.encoder_output_hook = hook
        try:
            yield
        finally:
            runner.encoder_output_hook = previous

    def _require(self) -> Scheduler:
        if self._scheduler is None:
            raise EngineNotRunningError("the engine is not running; call `await engine.start()` first")
        if self._scheduler.error is not None:
            raise EngineNotRunningError(f"the engine's scheduler crashed: {self._scheduler.error!r}")
        return self._scheduler

    def _stream_rules(self) -> StreamRules:
        """The loaded model's checks of a stream's requests (raises as :meth:`_require` while not running)."""
        self._require()
        assert self._rules is not None  # set before the scheduler starts
        return self._rules

    def open_stream(
        self,
        latency_ms: int | None = None,
        language: Any = None,
        boost_phrases: Sequence[str] | None = None,
        boost_alpha: float | None = None,
        eou: bool | None = None,
    ) -> ASRStream:
        """Open a stream.

        Args:
            latency_ms: One of the model's modes (``info.latency_modes``; the English model: 80, 160, 560 or
                1120; default: the config's ``default_latency_ms``).
            language: On a multilingual model, the language to transcribe: a locale of ``info.languages``
                (``"es-ES"``), a bare language (``"es"``, or Pipecat's ``Language.ES``) or ``"auto"``; default:
                the config's ``default_language``. Streams of different languages share batched steps.
            boost_phrases: Phrases the decoder favours on this stream (names, product words), spelled and cased
                as the model writes them (:mod:`~pipecat_nemotron.asr.boosting`); default: the config's
                ``default_boost_phrases``; an empty list: none. Streams with different lists, or none, share
                batched steps; one stream's phrases never change another's tokens.
            boost_alpha: Weight of the boost, in (0, 10]; default: the config's ``default_boost_alpha``.
            eou: Deliver the model's end-of-utterance events through :meth:`ASRStream.updates` (``"eou"``
                records, :mod:`~pipecat_nemotron.asr.eou`); default: the config's ``eou``. Needs a model that
                emits ``<EOU>`` (``info.eou``).

        Raises:
            CapacityError: ``max_streams`` streams are already open (existing streams are unaffected).
            EngineNotRunningError: ``start()`` has not completed.
            ValueError: Unsupported latency or language (names the allowed values).
            BoostPhraseError: A list over the limits or with characters the model cannot write (``ValueError``).
            BoostingUnavailableError: Phrases given, but no per-stream biasing (NeMo < 3.0.0, or
                ``max_boost_phrases=0``).
            EndOfUtteranceUnavailableError: ``eou`` asked for on a model without ``<EOU>`` (``ValueError``).

        """
        scheduler, rules = self._require(), self._stream_rules()
        latency = rules.latency(self.config.default_latency_ms if latency_ms is None else latency_ms)
        prompt = rules.language(language)
        wants_eou = rules.eou(eou)
        if boost_phrases is None:
            boost_phrases = self.config.default_boost_phrases
        boost = rules.boost(boost_phrases, boost_alpha)
        if len(scheduler.streams) >= self.config.max_streams:
            raise CapacityError(
                f"all {self.config.max_streams} ASR stream slots are in use; close a stream or raise "
                "EngineConfig.max_streams"
            )
        state = StreamState(
            stream_id=next(self._ids),
            latency_ms=latency,
            language=prompt[0],
            prompt_index=prompt[1],
            boost=None if boost.empty else boost,
            eou=wants_eou,
        )
        stream = ASRStream(self, state)
        scheduler.add(state, stream.updates_queue.put, stream.updates_queue.close)
        return stream

    async def transcribe(
        self,
        audio: bytes | np.ndarray,
        latency_ms: int | None = None,
        sample_rate: int = MODEL_SAMPLE_RATE,
        language: Any = None,
    ) -> Transcript:
        """Transcribe a whole clip by streaming it through the engine (batched with live streams).

        A clip longer than ``max_utterance_s`` is split like a live stream, and its parts are joined into one
        result (the split does not change the decode: the tokens are those of the clip as one utterance).

        Args:
            audio: int16 PCM bytes or a numpy array (see :meth:`ASRStream.push`).
            latency_ms: Latency mode to decode with.
            sample_rate: Rate of ``audio``, Hz.
            language: Language of a multilingual model (see :meth:`open_stream`).

        """
        stream = self.open_stream(latency_ms, language=language)
        try:
            await stream.push(audio, sample_rate=sample_rate)
            last = await stream.finalize()
            return join_forced_finals(stream.take_forced_finals(), last)
        finally:
            await stream.close()

    # ---- the stream contract (``StreamOwner``): called by ASRStream ---------------------------------------

    def wake(self) -> None:
        """Tell the scheduler that a stream queued work (part of :class:`StreamOwner`; streams call it)."""
        if self._scheduler is not None:
            self._scheduler.wake()

    def request_latency(self, state: StreamState, latency_ms: int) -> None:
        """Queue a stream's mode change, the one place it is validated (:meth:`ASRStream.set_latency`).

        Raises:
            ValueError: Not one of the loaded model's modes (names them).
            EngineNotRunningError: The engine is not running.

        """
        self._require().request_latency(state, self._stream_rules().latency(latency_ms))

    def request_language(self, state: StreamState, language: Any) -> None:
        """Queue a stream's language change (:meth:`ASRStream.set_language`).

        Raises:
            ValueError: The model has no such language (names the model's).
            EngineNotRunningError: The engine is not running.

        """
        self._require().request_language(state, *self._stream_rules().language(language))

    def request_boost(self, state: StreamState, phrases: Sequence[str] | None, alpha: float | None) -> None:
        """Queue a stream's boost-list change (:meth:`ASRStream.set_boost_phrases`); raises as it does."""
        self._require().request_boost(state, self._stream_rules().boost(phrases, alpha))

    async def close_stream(self, state: StreamState, error: BaseException | None = None) -> None:
        """Close a stream, failed with ``error`` if given (:meth:`ASRStream.close`); returns once its slot is free."""
        if self._scheduler is None or state.stream_id not in self._scheduler.streams:
            state.closed = True
            return
        await self._scheduler.release(state, error)

    def resolve_language(self, language: Any) -> str | None:
        """The language prompt a stream asking for ``language`` would decode with (see :meth:`open_stream`).

        Returns:
            A key of the model's prompt dictionary (``"es-ES"``, ``"auto"``), or None on an English-only model.

        Raises:
            ValueError: The model has no such language (the message lists the model's).
            EngineNotRunningError: The engine is not running.

        """
        return self._stream_rules().language(language)[0]
