"""Helpers shared by the test modules (no test module imports another; shared fixtures live in conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch
import ws_client
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    DataFrame,
    EndFrame,
    Frame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    MetricsFrame,
    ProposedUserStoppedSpeakingFrame,
    StartFrame,
    STTUpdateSettingsFrame,
    SystemFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    UserStoppedSpeakingFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.metrics.metrics import TTFBMetricsData
from pipecat.observers.base_observer import FramePushed
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.tests.utils import SleepFrame, run_test
from pipecat.utils.time import time_now_iso8601
from websockets.exceptions import ConnectionClosed

from pipecat_nemotron.agent.wav_input import read_pcm16, silence
from pipecat_nemotron.asr import ASRStream, EngineConfig, NemotronEngine
from pipecat_nemotron.bench.audio import wait_caught_up  # noqa: F401  (tests import it from here)
from pipecat_nemotron.models import DEMO_AUDIO_DIR
from pipecat_nemotron.observers.metrics import VoiceLatencyObserver, asr_finalize_metrics_frame
from pipecat_nemotron.server.app import ASRServer, ServerConfig
from pipecat_nemotron.server.protocol import CloseCode, ConfigMessage, parse_server_message
from pipecat_nemotron.stt import NemotronSTTService, NemotronSTTSettings
from pipecat_nemotron.stt.remote.service import NemotronServerSTTService


def offline_decode(
    engine: NemotronEngine, audio: np.ndarray, latency_ms: int, language: str | None = None
) -> tuple[list[int], torch.Tensor]:
    """Whole-clip (non-streaming) decode with the same attention context: tokens and encoder output [D, T].

    On a multilingual model ``language`` (a prompt key) goes through NeMo's own ``forward(prompt_indices=...)``.
    Runs the engine's model on the calling thread, so call it while no stream is being decoded; the encoder's
    attention context is restored afterwards (the engine's worker thread sets it only when it changes).
    """
    from pipecat_nemotron.asr.modes import model_latency_modes

    model = engine.model
    previous = list(model.encoder.att_context_size)
    try:
        with torch.inference_mode():
            model.encoder.set_default_att_context_size(list(model_latency_modes(model.encoder)[latency_ms]))
            signal, length = torch.from_numpy(audio)[None], torch.tensor([audio.size])
            if language is None:
                feats, feat_len = model.preprocessor(input_signal=signal, length=length)
                enc, enc_len = model.encoder(audio_signal=feats, length=feat_len)
            else:
                index = torch.tensor([model.cfg.model_defaults.prompt_dictionary[language]])
                enc, enc_len = model.forward(
                    input_signal=signal, input_signal_length=length, prompt_indices=index
                )
            hyp = model.decoding.rnnt_decoder_predictions_tensor(
                encoder_output=enc, encoded_lengths=enc_len, return_hypotheses=True
            )[0]
    finally:
        model.encoder.set_default_att_context_size(previous)
    return [int(t) for t in hyp.y_sequence.tolist()], enc[0, :, : int(enc_len[0])]


async def push_realtime_chunks(
    stream: ASRStream, pcm: bytes, chunk_bytes: int = 640, pause: float = 0.0
) -> None:
    """Push ``pcm`` in small pieces (20 ms at 640 bytes), yielding to the loop between them."""
    for i in range(0, len(pcm), chunk_bytes):
        await stream.push(pcm[i : i + chunk_bytes])
        await asyncio.sleep(pause)


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """One intra-op torch thread inside the block.

    On 2 busy cores, OpenMP threads spinning at barriers make the tiny models' latency-bound steps ~10x slower.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def noise_clip(seconds: float, seed: int = 0, level: float = 0.1) -> np.ndarray:
    """Deterministic float32 noise, 16 kHz (random weights turn any audio into tokens)."""
    rng = np.random.default_rng(seed)
    n = int(16000 * seconds)
    t = np.arange(n) / 16000.0
    tone = 0.3 * np.sin(2 * np.pi * (200 + 300 * seed) * t) * (np.sin(2 * np.pi * 1.5 * t) > 0)
    return (level * rng.standard_normal(n) + tone * level).astype(np.float32)


def to_pcm16(x: np.ndarray) -> bytes:
    """float32 [-1, 1] -> int16 little-endian bytes."""
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


FRAME_BYTES = 640  # 20 ms of 16 kHz int16


def audio_frames(pcm: bytes) -> list:
    """16 kHz mono PCM as 20 ms ``InputAudioRawFrame``s, as a transport delivers them."""
    from pipecat.frames.frames import InputAudioRawFrame

    return [
        InputAudioRawFrame(audio=pcm[i : i + FRAME_BYTES], sample_rate=16000, num_channels=1)
        for i in range(0, len(pcm), FRAME_BYTES)
    ]


def turn(pcm: bytes, wait: float = 1.5) -> list:
    """One user turn for ``run_test``: VAD start, the audio, VAD stop (stop_secs 0.2), then ``wait`` seconds."""
    from pipecat.frames.frames import VADUserStartedSpeakingFrame, VADUserStoppedSpeakingFrame
    from pipecat.tests.utils import SleepFrame

    return [
        VADUserStartedSpeakingFrame(),
        *audio_frames(pcm),
        VADUserStoppedSpeakingFrame(stop_secs=0.2),
        SleepFrame(sleep=wait),
    ]


async def run_language_switches(stt, engine: NemotronEngine, start_sleep: float = 0.2) -> tuple[list, list]:
    """What both STT services must do on the multilingual random model (three 1.3 s turns).

    The service starts in Spanish (``Language.ES``), refuses an update to ``"fr"`` with one ``ErrorFrame`` naming
    the model's languages (still Spanish), then applies ``"de"`` from the next turn. Asserts the finals equal the
    engine's own transcripts in those languages and carry them; returns ``(down, up)`` frames for more checks.
    """
    from pipecat.frames.frames import ErrorFrame, STTUpdateSettingsFrame, TranscriptionFrame
    from pipecat.tests.utils import SleepFrame, run_test
    from pipecat.transcriptions.language import Language

    from pipecat_nemotron.stt.base import NemotronSTTSettings

    a, b, c = (to_pcm16(noise_clip(1.3, seed=80 + i)) for i in range(3))
    expected = [
        await engine.transcribe(a, language="es-ES"),
        await engine.transcribe(b, language="es-ES"),  # the refused update leaves it in Spanish
        await engine.transcribe(c, language="de-DE"),
    ]
    down, up = await run_test(
        stt,
        frames_to_send=[
            SleepFrame(sleep=start_sleep),
            *turn(a),
            STTUpdateSettingsFrame(delta=NemotronSTTSettings(language="fr")),
            SleepFrame(sleep=0.1),
            *turn(b),
            STTUpdateSettingsFrame(delta=NemotronSTTSettings(language="de")),
            SleepFrame(sleep=0.1),
            *turn(c, wait=2.0),
        ],
        start_timeout=5.0,
    )
    finals = [f for f in down if isinstance(f, TranscriptionFrame)]
    assert [f.text for f in finals] == [e.text for e in expected]
    assert [f.language for f in finals] == [Language.ES_ES, Language.ES_ES, Language.DE_DE]
    assert [f.result.language for f in finals] == ["es-ES", "es-ES", "de-DE"]
    errors = [f.error for f in up if isinstance(f, ErrorFrame)]
    assert len(errors) == 1 and "'fr'" in errors[0] and "es-ES" in errors[0], errors
    assert stt.language == "de"
    return down, up


async def stream_capturing_encoder_output(
    engine: NemotronEngine, audio: np.ndarray, latency_ms: int, language: str | None = None
) -> tuple[object, torch.Tensor]:
    """Stream ``audio`` (160 ms pieces) and finalize: the final and the encoder output its decoder saw ``[D, T]``.

    On a multilingual model the output is the one after the stream's language prompt.
    """
    captured: list[torch.Tensor] = []
    stream = engine.open_stream(latency_ms=latency_ms, language=language)

    def hook(ids: list[int], enc: torch.Tensor, enc_len: torch.Tensor) -> None:
        for row, sid in enumerate(ids):
            if sid == stream.stream_id:
                captured.append(enc[row, :, : int(enc_len[row])].clone())

    try:
        with engine.observe_encoder_output(hook):
            await push_realtime_chunks(stream, to_pcm16(audio), chunk_bytes=3200)
            final = await stream.finalize()
    finally:
        await stream.close()
    return final, torch.cat(captured, dim=-1)


#: The tiny Magpie codec's samples per frame and sample rate (``magpie.tiny``), Hz.
MAGPIE_SAMPLES_PER_FRAME = 1024
MAGPIE_CODEC_RATE = 22050


def magpie_options_for(frames: int, **kwargs: Any) -> Any:
    """Magpie options whose ``max_duration_s`` allows exactly ``frames`` codec frames (the tiny model never ends).

    ceil((frames - 0.5) frames' worth of seconds x frame rate) == frames, clear of float rounding.
    """
    from pipecat_nemotron.tts.magpie import MagpieSynthesisOptions

    return MagpieSynthesisOptions(
        max_duration_s=(frames - 0.5) * MAGPIE_SAMPLES_PER_FRAME / MAGPIE_CODEC_RATE, **kwargs
    )


class MagpieAdmissionGate:
    """Holds a ``MagpieEngine``'s worker thread while it admits the request for ``text``, until :meth:`open`.

    The worker splits each request's text with NeMo's ``chunk_text_for_inference`` as it admits it (before its
    prefill); the gate waits inside that call, so a test can submit more requests, or do work on the event loop,
    at a known point instead of racing the worker. Other texts pass. The wait gives up after 60 s (a liveness
    guard: ``timed_out`` then tells the test).
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
        from nemo.collections.tts.parts.utils import tts_dataset_utils

        self.entered = threading.Event()
        self.timed_out = False
        self._open = threading.Event()
        split = tts_dataset_utils.chunk_text_for_inference

        def held(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("text") == text and not self._open.is_set():
                self.entered.set()
                self.timed_out = not self._open.wait(60)
            return split(*args, **kwargs)

        monkeypatch.setattr(tts_dataset_utils, "chunk_text_for_inference", held)

    async def wait_entered(self) -> None:
        """Wait (off the event loop) until the worker is held at the gate."""
        assert await asyncio.to_thread(self.entered.wait, 60), "the worker never started the request"

    def open(self) -> None:
        """Let the worker go on (the gate stays open)."""
        self._open.set()


class HoldSecondChunk:
    """Holds the worker thread as it hands the request for ``text`` its second audio chunk, until :meth:`release`.

    ``SynthesisStream.emit`` is how the worker delivers each chunk (both steps). Held there, the worker cannot
    finish the request before the test acts, however the machine schedules the two threads. The hold gives up
    after 60 s (a liveness guard).
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
        from pipecat_nemotron.tts.magpie.stream import SynthesisStream

        self._go = threading.Event()
        emit = SynthesisStream.emit
        seen: dict[int, int] = {}

        def held(stream: SynthesisStream, chunk) -> None:
            if stream.synthesis.text == text:
                seen[stream.id] = seen.get(stream.id, 0) + 1
                if seen[stream.id] == 2:
                    self._go.wait(60)
            emit(stream, chunk)

        monkeypatch.setattr(SynthesisStream, "emit", held)

    def release(self) -> None:
        """Let the worker deliver the chunk (and every later one)."""
        self._go.set()


SYNC = pytest.mark.filterwarnings("ignore:The test <Function:pytest.PytestWarning")


DEMO = DEMO_AUDIO_DIR


TOKEN = "test-token-0123456789abcdef"


def clip(name: str = "demo_math.wav", seed: int = 61, seconds: float = 1.6) -> bytes:
    """A bundled demo utterance (16 kHz int16), or deterministic noise where the demo WAVs are absent."""
    path = DEMO / name
    if path.exists():
        return read_pcm16(path, convert=True).tobytes()
    return to_pcm16(noise_clip(seconds, seed=seed))


@contextlib.asynccontextmanager
async def own_server(engine: NemotronEngine, **config: Any) -> AsyncIterator[ASRServer]:
    """A started server on ``engine`` with its own :class:`ServerConfig` (``port=0``), stopped at the end."""
    srv = ASRServer(engine, ServerConfig(port=0, **config))
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop(drain_timeout_s=0)


async def connect(url: str, token: str | None = TOKEN, **kwargs):
    """A protocol WebSocket with this file's token by default."""
    return await ws_client.connect(url, token=token, **kwargs)


async def open_session(url: str, config: ConfigMessage | None = None, token: str | None = TOKEN, **kwargs):
    """A session opened with this file's token by default: the socket and the server's first message."""
    return await ws_client.open_session(url, config, token=token, **kwargs)


async def expect_close(ws, code: int, timeout: float = 10.0) -> list:
    """Read until the server closes; return the messages; assert the close code."""
    messages = []
    try:
        async with asyncio.timeout(timeout):
            async for raw in ws:
                if isinstance(raw, str):
                    messages.append(parse_server_message(raw))
    except ConnectionClosed:
        pass
    assert ws.close_code == code, (ws.close_code, ws.close_reason, messages)
    return messages


async def wait_for(predicate, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def free_slots_restored(server: ASRServer, engine: NemotronEngine):
    return lambda: server.service.active_sessions == 0 and engine.open_streams == 0


async def drop_first_session_after(server: ASRServer, audio_ms: float, timeout: float = 20.0) -> None:
    """Fail the first session with 4500 once it has received ``audio_ms`` of audio (a server-side failure)."""
    await wait_for(
        lambda: any(s.audio_received_ms > audio_ms for s in server.service.sessions.values()), timeout=timeout
    )
    session = next(iter(server.service.sessions.values()))
    await session.fail(CloseCode.INTERNAL, "simulated server failure")


async def run_through_a_drop(
    stt: NemotronServerSTTService,
    server: ASRServer,
    pcm: bytes,
    drop_after_ms: float,
    split: Fraction,
    wait_s: float,
    timeout: float = 20.0,
) -> list[Frame]:
    """Run ``stt`` through one utterance while the server fails its first session mid-utterance.

    The drop comes once the session has received ``drop_after_ms`` of audio, and lands in a 0.5 s pause after
    ``split`` of the utterance's frames; ``wait_s`` after the VAD stop the pipeline ends. Returns the frames
    pushed downstream.
    """
    dropper = asyncio.create_task(drop_first_session_after(server, drop_after_ms, timeout=timeout))
    frames = audio_frames(pcm)
    cut = int(len(frames) * split)
    down, _ = await run_test(
        stt,
        frames_to_send=[
            SleepFrame(sleep=0.2),
            VADUserStartedSpeakingFrame(),
            *frames[:cut],
            SleepFrame(sleep=0.5),  # the drop lands here, mid-utterance
            *frames[cut:],
            VADUserStoppedSpeakingFrame(stop_secs=0.2),
            SleepFrame(sleep=wait_s),
        ],
        start_timeout=5.0,
    )
    await dropper
    return down


def finals_of(frames) -> list[TranscriptionFrame]:
    return [f for f in frames if isinstance(f, TranscriptionFrame)]


def latency_change_turns(a: bytes, b: bytes) -> list[Frame]:
    """Frames of two user turns, ``a`` then ``b``, with a switch to the 560 ms mode between them."""
    return [
        SleepFrame(sleep=0.2),
        *turn(a),
        STTUpdateSettingsFrame(delta=NemotronSTTSettings(latency_ms=560)),
        SleepFrame(sleep=0.1),
        *turn(b, wait=2.0),
    ]


class FakeClock:
    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


STT = FrameProcessor(name="NemotronStreamingSTTService#0")


async def push(
    observer: VoiceLatencyObserver, clock: FakeClock, at: float, source: FrameProcessor, frame: Frame
):
    clock.now = at
    await observer.on_push_frame(
        FramePushed(
            source=source, destination=SINK, frame=frame, direction=FrameDirection.DOWNSTREAM, timestamp=0
        )
    )


@dataclass(frozen=True)
class TurnTimes:
    """How long each stage of a fed turn takes, seconds (``tts`` None: the TTS reports no TTFB)."""

    stop_secs: float = 0.2
    finalize: float = 0.018
    ttfs: float = 0.25
    llm: float = 0.16
    tts: float | None = 0.10


async def feed_turn(
    observer: VoiceLatencyObserver,
    clock: FakeClock,
    t0: float,
    text: str = "what time is it",
    t: TurnTimes = TurnTimes(),  # noqa: B008  (frozen)
) -> None:
    """One user turn as Pipecat pushes it, from speech start at ``t0``, its stages taking ``t``."""
    speech_end = t0 + 1.0
    vad_stop = speech_end + t.stop_secs
    transcript_at = speech_end + t.ttfs
    first_token = transcript_at + 0.01 + t.llm
    first_audio = first_token + (t.tts or 0.05)
    events: list[tuple[float, FrameProcessor, Frame]] = [
        (t0, STT, VADUserStartedSpeakingFrame(start_secs=0.2)),
        (vad_stop, STT, VADUserStoppedSpeakingFrame(stop_secs=t.stop_secs, timestamp=vad_stop)),
        (transcript_at - 0.001, STT, asr_finalize_metrics_frame(STT.name, "asr", t.finalize * 1000)),
        (transcript_at, STT, ttfb(STT, t.ttfs)),
        (
            transcript_at,
            STT,
            TranscriptionFrame(text=text, user_id="u", timestamp=time_now_iso8601(), finalized=True),
        ),
        (transcript_at + 0.005, STT, UserStoppedSpeakingFrame()),
        (transcript_at + 0.01, LLM, LLMFullResponseStartFrame()),
        (first_token, LLM, ttfb(LLM, t.llm)),
        (first_token, LLM, LLMTextFrame(text="It is noon.")),
        *([(first_audio, TTS, ttfb(TTS, t.tts))] if t.tts is not None else []),
        (first_audio, TTS, TTSAudioRawFrame(audio=b"\0\0" * 160, sample_rate=16000, num_channels=1)),
        (first_audio + 0.02, TTS, BotStartedSpeakingFrame()),
    ]
    for at, source, frame in events:
        await push(observer, clock, at, source, frame)


class FrameRecorder(FrameProcessor):
    """Passes frames through, keeping the ones a test asks about."""

    def __init__(self, types: tuple[type, ...]) -> None:
        super().__init__()
        self.types = types
        self.frames: list = []

    async def process_frame(self, frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, self.types):
            self.frames.append(frame)
        await self.push_frame(frame, direction)


LLM = FrameProcessor(name="NvidiaLLMService#0")


TTS = FrameProcessor(name="MagpieTTSService#0")


SINK = FrameProcessor(name="sink")


def ttfb(source: FrameProcessor, seconds: float) -> MetricsFrame:
    return MetricsFrame(data=[TTFBMetricsData(processor=source.name, value=seconds)])


def engine_config(model: Any, **overrides: Any) -> EngineConfig:
    """The tests' engine settings: ``model`` on the CPU, 4 streams in batches of 4, unless overridden."""
    settings: dict[str, Any] = {"device": "cpu", "max_streams": 4, "max_batch_size": 4, **overrides}
    return EngineConfig(model=str(model), **settings)


@contextlib.asynccontextmanager
async def started_engine(model: Any, *, one_thread: bool = False, **overrides: Any) -> AsyncIterator[NemotronEngine]:
    """A started engine of :func:`engine_config` (with torch on one thread if asked), stopped on exit."""
    with one_torch_thread() if one_thread else contextlib.nullcontext():
        engine = NemotronEngine(engine_config(model, **overrides))
        await engine.start()
        try:
            yield engine
        finally:
            await engine.stop()


#: Longest wait of a :func:`run_steps` step before the test fails, s: a liveness guard, not a timing.
STEP_HANG_S = 60.0


@dataclass(frozen=True)
class Until:
    """A :func:`run_steps` step: wait until ``check(down, up)`` holds (the frames that came out so far)."""

    what: str
    check: Callable[[list[Frame], list[Frame]], bool]


@dataclass(frozen=True)
class Then:
    """A :func:`run_steps` step: call ``action()`` (e.g. let a held turn analyzer answer); await what it returns,
    if awaitable (e.g. ``stt.wait_until_ready``)."""

    action: Callable[[], object]


class _Flush:
    """A :func:`run_steps` step: wait until the processor has handled every frame sent before it."""


#: Passes a data and a system marker through the processor and waits for both to come out: its data frames and
#: its system frames (audio, VAD) go through different queues, so each kind needs its own marker.
FLUSH = _Flush()


class _DataMarker(DataFrame):
    pass


class _SystemMarker(SystemFrame):
    pass


class _Edge(FrameProcessor):
    """An end of :func:`run_steps`' pipeline: keeps the frames leaving the processor in ``direction``."""

    def __init__(self, direction: FrameDirection, frames: list[Frame], markers: set[int]) -> None:
        super().__init__(enable_direct_mode=True)
        self._direction = direction
        self._frames = frames
        self._markers = markers

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, (_DataMarker, _SystemMarker)) and self._direction == FrameDirection.DOWNSTREAM:
            self._markers.add(id(frame))  # through the processor: the end of the line
            return
        if direction == self._direction and not isinstance(frame, (StartFrame, EndFrame)):
            self._frames.append(frame)
        await self.push_frame(frame, direction)


async def run_steps(
    processor: FrameProcessor, steps: list[Frame | Until | Then | _Flush], *, start_timeout: float = 5.0
) -> tuple[list[Frame], list[Frame]]:
    """Pipecat's ``run_test`` driven by events: ``(downstream frames, upstream frames)`` that left ``processor``.

    Frames are queued in order; an :class:`Until` waits for its condition, :data:`FLUSH` until the processor has
    handled what was sent, a :class:`Then` acts. Nothing waits on the clock (each wait fails after
    :data:`STEP_HANG_S`, naming what never came). An ``EndFrame`` ends the run.
    """
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.workers.runner import WorkerRunner

    down: list[Frame] = []
    up: list[Frame] = []
    markers: set[int] = set()
    worker = PipelineWorker(
        Pipeline(
            [
                _Edge(FrameDirection.UPSTREAM, up, markers),
                processor,
                _Edge(FrameDirection.DOWNSTREAM, down, markers),
            ]
        ),
        cancel_on_idle_timeout=False,
    )
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(_worker: Any, _frame: Any) -> None:
        started.set()

    async def drive() -> None:
        await asyncio.wait_for(started.wait(), start_timeout)
        for step in steps:
            if isinstance(step, Frame):
                await worker.queue_frame(step)
            elif isinstance(step, Until):
                await wait_for(lambda step=step: step.check(down, up), STEP_HANG_S, step.what)
            elif isinstance(step, Then):
                result = step.action()
                if inspect.isawaitable(result):
                    await asyncio.wait_for(result, STEP_HANG_S)
            elif isinstance(step, _Flush):
                data, system = _DataMarker(), _SystemMarker()
                await worker.queue_frame(data)
                await worker.queue_frame(system)
                await wait_for(
                    lambda d=data, s=system: {id(d), id(s)} <= markers, STEP_HANG_S, "the frames sent to be handled"
                )
            else:
                raise TypeError(f"not a step: {step!r}")
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run = asyncio.ensure_future(runner.run())
    try:
        await drive()
    except BaseException:
        await worker.cancel()
        await asyncio.gather(run, return_exceptions=True)
        raise
    await run
    return down, up


class _WatchedPeeks:
    """Mixin for the Nemotron STT services: counts the eager peeks answered and the predictions being pushed.

    ``_peek_text`` is the services' documented subclass hook for a peek; what follows an answer (the prediction
    pushed, or held) runs in the same task, with no await before the push starts.
    """

    peeks = 0
    _pushing = 0

    async def _peek_text(self) -> str:
        text = await super()._peek_text()  # type: ignore[misc]
        self.peeks += 1
        return text

    async def _push_eager_end_of_turn(self, *args: Any, **kwargs: Any) -> None:
        self._pushing += 1
        try:
            await super()._push_eager_end_of_turn(*args, **kwargs)  # type: ignore[misc]
        finally:
            self._pushing -= 1

    def peeks_settled(self, count: int) -> bool:
        """Whether ``count`` peeks have been answered, and the prediction of the last (if any) pushed."""
        return self.peeks >= count and not self._pushing


class WatchedSTTService(_WatchedPeeks, NemotronSTTService):
    """``NemotronSTTService`` with :class:`_WatchedPeeks` (for :func:`paused_turn`)."""


class WatchedServerSTTService(_WatchedPeeks, NemotronServerSTTService):
    """``NemotronServerSTTService`` with :class:`_WatchedPeeks` (for :func:`paused_turn`)."""


def _after_the_final(kind: type) -> Callable[[list[Frame], list[Frame]], bool]:
    def check(down: list[Frame], _up: list[Frame]) -> bool:
        finals = [i for i, f in enumerate(down) if type(f) is TranscriptionFrame]
        return bool(finals) and any(isinstance(f, kind) for f in down[finals[0] :])

    return check


def paused_turn(stt: _WatchedPeeks, pcm: bytes, resume: bytes = b"", *, commits: bool = True) -> list:
    """:func:`run_steps` for a user turn with a 0.4 s pause after ``pcm`` (then ``resume``, if any, and a second
    pause), ended by a VAD stop; ``stt`` is a :class:`WatchedSTTService` or :class:`WatchedServerSTTService`.

    The audio arrives in a burst, and a pause's peek answers once the engine has decoded all of it (~0.3 s here,
    over 1 s on a loaded 2-core machine): nothing more is sent until it has answered (a prediction pushed, or
    held), since a VAD stop first would make it moot. After the VAD stop the final comes, and with ``commits`` the
    proposed turn stop after it.
    """
    pause = audio_frames(silence(0.4, 16000))
    steps: list = [
        Then(stt.wait_until_ready),  # type: ignore[attr-defined]
        VADUserStartedSpeakingFrame(),
        *audio_frames(pcm),
        *pause,
        Until("the eager peek at the pause", lambda *_: stt.peeks_settled(1)),
    ]
    if resume:
        steps += [
            *audio_frames(resume),
            *pause,
            Until("the eager peek at the second pause", lambda *_: stt.peeks_settled(2)),
        ]
    steps += [
        VADUserStoppedSpeakingFrame(stop_secs=0.2),
        Until("the final", _after_the_final(TranscriptionFrame)),
    ]
    if commits:
        steps.append(Until("the proposed turn stop after the final", _after_the_final(ProposedUserStoppedSpeakingFrame)))
    return steps


def of(frames: list[Frame], kind: type) -> list[Frame]:
    return [f for f in frames if type(f) is kind]
