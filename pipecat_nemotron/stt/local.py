"""``NemotronSTTService``: Nemotron Speech streaming ASR running locally, in this process, as a Pipecat STT.

Not to be confused with Pipecat's ``NvidiaSTTService``, which calls a *remote* Riva/NIM server over gRPC.
This service runs the cache-aware model itself (on the local GPU, or CPU), batched with every other session
of the process through one shared :class:`~pipecat_nemotron.asr.NemotronEngine`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from loguru import logger
from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    Frame,
    StartFrame,
)
from pipecat.transcriptions.language import Language

from pipecat_nemotron.asr import (
    DEFAULT_MODEL,
    ASRStream,
    EngineConfig,
    NemotronEngine,
    NemotronEngineError,
    Transcript,
)
from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE
from pipecat_nemotron.asr.errors import BoostingUnavailableError, BoostPhraseError
from pipecat_nemotron.asr.shared import SharedEngines
from pipecat_nemotron.runtime.nemo_loading import prefetch_nemo_imports
from pipecat_nemotron.stt.base import NEMOTRON_TTFS_P99, NemotronSTTBase, NemotronSTTSettings
from pipecat_nemotron.stt.eager import EagerSettings
from pipecat_nemotron.stt.engine_lease import EngineLease
from pipecat_nemotron.stt.finals import OwedFinals
from pipecat_nemotron.stt.while_loading import HeldInput

__all__ = [
    "DEFAULT_FINAL_TIMEOUT_S",
    "DEFAULT_LOAD_WAIT_S",
    "NEMOTRON_TTFS_P99",
    "NemotronSTTService",
    "NemotronSTTSettings",
]

#: Default bound on how long the end of a session waits for a model that is still loading, seconds. A cold
#: process imports NeMo and restores the checkpoint (~20 s on a 2-core CPU, more for the 600M model from disk).
DEFAULT_LOAD_WAIT_S = 120.0

#: Default bound on how long the end of a session waits for the finals still owed, seconds. An engine that keeps
#: up decodes them in milliseconds; on a busy CPU a final has taken 8 s, and nothing is lost by waiting longer.
DEFAULT_FINAL_TIMEOUT_S = 60.0


class NemotronSTTService(NemotronSTTBase):
    """Local, in-process NVIDIA Nemotron Speech streaming ASR (cache-aware FastConformer-RNNT) for Pipecat.

    ``run_stt`` only queues audio; partial transcripts are pushed as ``InterimTranscriptionFrame`` whenever
    the text changes, and at the end of the user's turn (``VADUserStoppedSpeakingFrame``) the utterance is
    finalized and pushed as one ``TranscriptionFrame`` with ``finalized=True``. Pipecat then reports TTFS
    (speech end to final); this service also pushes the pure finalize time (finalize call to final text) as
    an ``asr_finalize`` processing metric.

    Every service in the process naming the same model and device shares one engine (loaded once, batched
    across sessions). Pass ``engine=`` to use one you created and started yourself.

    Example::

        stt = NemotronSTTService(model="nvidia/nemotron-speech-streaming-en-0.6b", latency_ms=160)

    With ``eager=EagerSettings()`` a pause of ``EagerSettings.silence_ms`` pushes the utterance's text, peeked
    without ending it (:meth:`ASRStream.peek <pipecat_nemotron.asr.ASRStream.peek>`, one batched model step),
    as an ``EagerTranscriptionFrame``, so the LLM starts before the VAD commits the turn (see
    :class:`~pipecat_nemotron.stt.base.NemotronSTTBase`).

    Args:
        model: Local ``.nemo`` path or model id (ignored when ``engine`` or ``engine_config`` is given).
        latency_ms: Initial latency mode, one of the model's: 80, 160, 560 or 1120 ms (the multilingual
            model adds 320).
        language: On a multilingual model (``nvidia/nemotron-3.5-asr-streaming-0.6b``), the language to
            transcribe: Pipecat's ``Language`` (``Language.ES``), a locale (``"es-ES"``) or ``"auto"``;
            None: the engine's ``default_language`` (``auto``). Change it with
            ``STTUpdateSettingsFrame(delta=NemotronSTTSettings(language=...))``; it applies from the next
            utterance. Frames carry the language decoded with.
        device: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        model_revision: Pinned revision of a model id.
        engine: A started (or startable) engine to use; this service never stops it.
        engine_config: Full engine settings, shared through ``registry``.
        registry: Where shared engines live (default: the process-wide one).
        ttfs_p99_latency: P99 speech-end-to-final time, seconds. Default: ``0.2`` (VAD stop) plus 1.5x the
            engine's measured finalize p99 once loaded, or :data:`NEMOTRON_TTFS_P99` before that.
        load_wait_s: When the session ends (``EndFrame``) while the model is still loading, wait this long
            for the load, then transcribe the audio kept meanwhile and deliver its finals; past it (or if the
            load fails) the session reports, as an ``ErrorFrame``, how many seconds of audio it dropped.
            Seconds. Load the model at process start (:meth:`SharedEngines.preload
            <pipecat_nemotron.asr.shared.SharedEngines.preload>`) so no session waits at all.
        final_timeout_s: When the session ends, wait up to this long for the finals still owed (the last
            utterance's, and any the engine is still decoding), seconds. A final not delivered by then is
            reported in an ``ErrorFrame`` with the seconds of audio it covered.
        cpu_threads: On CPU, torch's intra-op threads for the model (``EngineConfig.cpu_threads``; None: half
            the cores). Only with ``model``/``device``: an ``engine`` or ``engine_config`` carries its own.
        settings: Runtime settings (:class:`NemotronSTTSettings`); override the arguments above.
        eager: The eager end of turn (:class:`~pipecat_nemotron.stt.eager.EagerSettings`); None: off.
        boost_phrases: Phrases to boost (names, product words), spelled and cased as the model writes them; None:
            none. At most ``EngineConfig.max_boost_phrases`` of ``max_boost_phrase_chars``. Updatable, from the
            next utterance: ``STTUpdateSettingsFrame(delta=NemotronSTTSettings(boost_phrases=[...]))``.
        boost_alpha: Boosting weight in (0, 10]; None: the engine's default.
        turn_commit: An end-of-turn commit that reads the model's ``<EOU>`` (``turn_commit_for("eou")``): the
            service then owns turn detection (see :class:`~pipecat_nemotron.stt.base.NemotronSTTBase`).
        **kwargs: :class:`~pipecat.services.stt_service.STTService`'s.

    Raises:
        ValueError: Unsupported latency, device, ``load_wait_s``, ``final_timeout_s``, ``cpu_threads`` or boost
            phrases (the message names the allowed values). Characters the model cannot write fail the stream's open.
        EndOfUtteranceUnavailableError: The turn commit reads ``<EOU>`` and the model (a local ``.nemo`` file, or
            a given engine's) has no such token (a ``ValueError``; the message names the models that have it).

    """

    def __init__(
        self,
        *,
        model: str = DEFAULT_MODEL,
        latency_ms: int = 160,
        language: Language | str | None = None,
        device: str = "auto",
        model_revision: str | None = None,
        engine: NemotronEngine | None = None,
        engine_config: EngineConfig | None = None,
        registry: SharedEngines | None = None,
        ttfs_p99_latency: float | None = None,
        load_wait_s: float = DEFAULT_LOAD_WAIT_S,
        final_timeout_s: float = DEFAULT_FINAL_TIMEOUT_S,
        cpu_threads: int | None = None,
        settings: NemotronSTTSettings | None = None,
        eager: EagerSettings | None = None,
        boost_phrases: Sequence[str] | None = None,
        boost_alpha: float | None = None,
        **kwargs: Any,
    ) -> None:
        """Create the service (arguments: see the class); the model loads off the event loop at ``StartFrame``."""
        if not load_wait_s >= 0:
            raise ValueError(f"load_wait_s must be >= 0 (seconds), got {load_wait_s!r}")
        if not final_timeout_s >= 0:
            raise ValueError(f"final_timeout_s must be >= 0 (seconds), got {final_timeout_s!r}")
        #: Where the engine comes from (given or shared) and what its loaded model allows.
        self._lease = EngineLease(
            model=model,
            model_revision=model_revision,
            device=device,
            cpu_threads=cpu_threads,
            engine=engine,
            engine_config=engine_config,
            registry=registry,
        )
        super().__init__(
            latency_ms=latency_ms,
            model=self._lease.config.model,
            language=language,
            ttfs_p99_latency=ttfs_p99_latency,
            settings=settings,
            eager=eager,
            boost_phrases=boost_phrases,
            boost_alpha=boost_alpha,
            **kwargs,
        )
        self._lease.check_boost_limits(self.boost_phrases)
        if self.wants_eou:
            self._lease.check_eou()
        self._load_wait_s = float(load_wait_s)
        self._final_timeout_s = float(final_timeout_s)
        self._owed = OwedFinals()
        self._stream: ASRStream | None = None
        self._connect_task: asyncio.Task[None] | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._pending = HeldInput()  # what arrives before the stream opens, handed to it once the engine runs
        # Set when the engine could not be started for this session: audio is then not kept; what arrives
        # after the failure is counted here and reported when the session ends.
        self._load_failed = False
        self._dropped_after_failure_s = 0.0
        if self._lease.cold:
            # Importing NeMo is most of a cold start: begin it now, while the pipeline is being built.
            prefetch_nemo_imports()

    # ---- properties ---------------------------------------------------------------------------------------

    @property
    def engine(self) -> NemotronEngine | None:
        """The engine this session runs on (None until started)."""
        return self._lease.engine

    @property
    def stream(self) -> ASRStream | None:
        """The engine stream of this session (None until connected, and after stop)."""
        return self._stream

    def _finalize_p99_ms(self) -> float | None:
        """The engine's finalize p99 (its recent finals), ms; None before the engine runs or finalizes."""
        return self._lease.finalize_p99_ms()

    # ---- lifecycle ----------------------------------------------------------------------------------------

    async def start(self, frame: StartFrame) -> None:
        """Open this session's stream; the engine loads in the background if it is not loaded yet."""
        await super().start(frame)
        self._connect_task = self.create_task(self._connect(), name=f"{self}::connect")

    async def _connect(self) -> None:
        try:
            await self._lease.acquire()
            self._open_stream()
            self._readiness.ready()
        except Exception as e:
            self._load_failed = True
            dropped_s = self._drop_pending()
            # A started engine that refuses the stream (a language the model lacks) is this session's setting.
            what = "engine failed to start" if self._lease.engine is None else "session could not open its stream"
            logger.error(f"{self}: Nemotron ASR {what} ({dropped_s:.1f} s of audio not transcribed): {e}")
            self._readiness.fail(f"{self}: Nemotron ASR {what}: {e}", e)
            await self.push_error(
                error_msg=(
                    f"Nemotron ASR {what}: {e}; {dropped_s:.1f} s of this session's audio were not transcribed"
                ),
                exception=e,
                force_treat_as_permanent=True,
            )
            return
        await self._replay_pending()

    async def _replay_pending(self) -> None:
        """Hand the audio and finalize marks kept while loading to the stream, in order (newer items queue)."""
        await self._pending.replay(self._push_audio, self._finalize)

    def _drop_pending(self) -> float:
        """Forget the audio kept while loading; return how much it was, seconds."""
        return self._pending.drop(self.sample_rate or MODEL_SAMPLE_RATE)

    async def _wait_for_load(self) -> None:
        """At the end of a session, wait (bounded by ``load_wait_s``) for a model still loading.

        On success the kept audio has been replayed; on timeout the load is abandoned for this session and an
        ``ErrorFrame`` says how much audio was dropped and why.
        """
        task = self._connect_task
        if task is None or task.done():
            return
        kept_s = self._pending.seconds(self.sample_rate or MODEL_SAMPLE_RATE)
        logger.info(
            f"{self}: the session ended while the ASR model is loading; waiting up to {self._load_wait_s:g} s "
            f"to transcribe the {kept_s:.1f} s of audio received meanwhile"
        )
        done, _ = await asyncio.wait({task}, timeout=self._load_wait_s)
        if done:
            return
        self._connect_task = None
        await self.cancel_task(task)
        dropped_s = self._drop_pending()
        msg = (
            f"the Nemotron ASR model did not load within {self._load_wait_s:g} s (load_wait_s) of the end of the "
            f"session; {dropped_s:.1f} s of audio were not transcribed. Load it at process start "
            "(SharedEngines.preload / AgentSettings.preload) or raise load_wait_s"
        )
        logger.warning(f"{self}: {msg}")
        await self.push_error(error_msg=msg)

    def _open_stream(self) -> None:
        engine = self._lease.engine
        assert engine is not None
        self._stream = engine.open_stream(
            latency_ms=self.latency_ms,
            language=self.language,
            boost_phrases=self.boost_phrases or None,
            boost_alpha=self.boost_alpha,
            eou=self.wants_eou,
        )
        self._last_interim = ""  # a new stream starts its interim text afresh
        self._owed.reset()
        self._reader_task = self.create_task(self._read_updates(self._stream), name=f"{self}::results")

    async def _close(self, drain: bool = False) -> None:
        """Close the stream and release the engine.

        Args:
            drain: Let the results task deliver the updates already queued (a final) before it ends.

        """
        if self._connect_task is not None:
            await self.cancel_task(self._connect_task)
            self._connect_task = None
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.close()
        task, self._reader_task = self._reader_task, None
        if task is not None:
            if drain:
                # The stream is closed, so its updates iterator ends after the queued updates: finals already
                # decoded, whose delivery takes milliseconds.
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(task), timeout=5.0)
            if not task.done():
                await self.cancel_task(task)
        await self._lease.release()
        dropped_s = self._drop_pending()
        if dropped_s > 0:
            logger.warning(f"{self}: session cancelled; {dropped_s:.1f} s of audio were not transcribed")

    async def stop(self, frame: EndFrame) -> None:
        """Finalize what the user said last (if anything), wait for the finals owed, then close the stream.

        If the model is still loading, first wait for it (up to ``load_wait_s``) so that the audio received
        meanwhile is transcribed. Then wait (up to ``final_timeout_s``) while the engine decodes the finals still
        owed; one that never arrives is reported in an ``ErrorFrame`` naming the seconds of audio it covered.
        """
        await self._stop_eou_wait()
        await self._wait_for_load()
        if self._dropped_after_failure_s > 0:
            await self.push_error(
                error_msg=(
                    f"Nemotron ASR was not available; {self._dropped_after_failure_s:.1f} s more of this "
                    "session's audio, received after the failure, were not transcribed"
                )
            )
            self._dropped_after_failure_s = 0.0
        stream = self._stream
        if stream is not None and not stream.closed and stream.has_pending_speech:
            self.request_finalize()
            # The final reaches the pipeline through the results task, like every other final.
            await self._finalize()
        await self._owed.wait(self._final_timeout_s, self)
        await self._close(drain=True)
        lost = self._owed.lost_message(self._final_timeout_s)
        if lost is not None:
            logger.error(f"{self}: {lost}")
            await self.push_error(error_msg=f"Nemotron ASR: {lost}")
        await super().stop(frame)

    async def cancel(self, frame: CancelFrame) -> None:
        """Close the stream at once, freeing its slot."""
        await self._stop_eou_wait()
        await self._close()
        await super().cancel(frame)

    # ---- audio in -----------------------------------------------------------------------------------------

    async def run_stt(self, audio: bytes) -> AsyncGenerator[Frame | None, None]:
        """Queue audio for the engine; results are pushed by this service's own results task."""
        if self._load_failed:
            # The engine failed to start (an ErrorFrame said so); the end of the session reports this audio too.
            self._dropped_after_failure_s += len(audio) / (2.0 * (self.sample_rate or MODEL_SAMPLE_RATE))
        elif self._stream is None or self._pending:
            self._pending.hold_audio(audio)
        else:
            await self._push_audio(audio)
            if self._stream is not None:
                await self._eager_progress(self._stream.audio_seconds * 1000.0)
        yield None

    async def _push_audio(self, audio: bytes) -> None:
        stream = self._stream
        if stream is None:
            return
        try:
            await stream.push(audio, sample_rate=self.sample_rate, num_channels=1)
        except NemotronEngineError as e:
            await self._stream_failed(e)
            return
        self._owed.add_audio(len(audio) / (2.0 * (self.sample_rate or MODEL_SAMPLE_RATE)))

    async def _stream_failed(self, error: BaseException) -> None:
        """Report a failed stream (this session only) and continue on a fresh one."""
        logger.error(f"{self}: ASR stream failed: {error}")
        await self.push_error(error_msg=f"Nemotron ASR stream failed: {error}", exception=error)
        old, self._stream = self._stream, None
        if old is not None:
            await old.close()
        if self._reader_task is not None:
            await self.cancel_task(self._reader_task)
            self._reader_task = None
        engine = self._lease.engine
        if engine is not None and engine.running:
            self._open_stream()

    # ---- end of turn --------------------------------------------------------------------------------------

    async def _end_utterance(self) -> None:
        """Finalize the utterance (at a VAD stop; an EOU commit's on the ``<EOU>``); held while the model loads."""
        self.request_finalize()
        if self._load_failed:
            pass
        elif self._stream is None or self._pending:
            self._pending.hold_finalize()
        else:
            await self._finalize()

    async def _finalize(self) -> None:
        stream = self._stream
        if stream is None or stream.closed:
            return
        try:
            stream.request_final()  # the final arrives through the updates, like every other result
        except NemotronEngineError as e:
            await self._stream_failed(e)
            return
        self._owed.finalized()

    async def _read_updates(self, stream: ASRStream) -> None:
        try:
            async for update in stream.updates():
                if update.is_final:
                    await self._on_final(update)
                elif update.kind == "eou":
                    await self._on_eou(update.utterance, update.eou_ms, update.text)
                else:
                    await self._push_interim(update.text, update)
                    await self._eager_progress(stream.audio_seconds * 1000.0, text_changed=True)
        except NemotronEngineError as e:
            self._owed.ended(e)
            if self._stream is stream:
                await self._stream_failed(e)
            return
        self._owed.ended()

    async def _peek_text(self) -> str:
        """The open utterance's text as its final would be now (:meth:`ASRStream.peek`); "" while loading."""
        stream = self._stream
        if stream is None or stream.closed or self._pending:
            return ""
        return (await stream.peek()).text

    async def _on_final(self, update: Transcript) -> None:
        if update.forced:  # split at the engine's max_utterance_s: the turn goes on
            await self._push_forced_final(update)
            return
        self._owed.answered()
        ttf_ms = update.ttf_ms or 0.0
        if await self._push_final(update, ttf_ms, self._lease.config.model):
            logger.info(
                f"{self}: final for utterance {update.utterance} in {ttf_ms:.1f} ms ({update.latency_ms} ms mode)"
            )

    # ---- settings -----------------------------------------------------------------------------------------

    def _latency_modes(self) -> tuple[int, ...] | None:
        """The loaded model's modes (None until the engine runs)."""
        return self._lease.latency_modes()

    def _language_problem(self, language: Any) -> str | None:
        """The engine's refusal of ``language`` (None until the engine runs; it then checks at stream open)."""
        return self._lease.language_problem(language)

    async def _apply_language(self) -> None:
        """Switch the open stream's language from its next utterance (a stream opened later starts in it)."""
        if self._stream is not None and not self._stream.closed:
            self._stream.set_language(self.language)

    async def _apply_latency(self) -> None:
        """Switch the open stream to the new mode (a stream opened later starts in it)."""
        if self._stream is not None and not self._stream.closed:
            self._stream.set_latency(self.latency_ms)

    async def _apply_boost(self) -> str | None:
        """Give the open stream the new phrases from its next utterance; the engine's refusal (limits, characters)."""
        if self._stream is not None and not self._stream.closed:
            try:
                self._stream.set_boost_phrases(self.boost_phrases, alpha=self.boost_alpha)
            except (BoostPhraseError, BoostingUnavailableError) as e:
                return str(e)
        return None
