"""Reading 16-bit PCM audio files, and feeding a WAV file into a Pipecat pipeline as if a user were speaking it.

The one home of the package's audio file readers: the demo, examples and tests feed WAVs with :func:`feed_wav`;
benchmarks, the load generator and the scripts read model-rate samples with :func:`read_pcm16` and
:func:`read_float32`. Pipecat is imported only by :func:`feed_wav`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE

if TYPE_CHECKING:
    from pipecat.pipeline.worker import PipelineWorker

#: Audio per frame, ms (what transports deliver).
FRAME_MS = 20


def _read_int16(path: str | Path) -> tuple[np.ndarray, int]:
    """A 16-bit PCM WAV or FLAC file as ``(int16 samples shaped [frames, channels], sample_rate Hz)``.

    Raises:
        ValueError: Not 16-bit PCM (the message says how to convert it).

    """
    import soundfile

    info = soundfile.info(str(path))
    if info.subtype != "PCM_16":
        raise ValueError(
            f"{path}: expected 16-bit PCM WAV or FLAC, got {info.subtype}; convert with `sox in.wav -b 16 out.wav`"
        )
    samples, rate = soundfile.read(str(path), dtype="int16", always_2d=True)
    return samples, int(rate)


def read_wav(path: str | Path) -> tuple[bytes, int, int]:
    """Read a PCM16 WAV file as it is.

    Returns:
        ``(pcm16 bytes, sample_rate Hz, num_channels)`` (channels interleaved).

    Raises:
        ValueError: Not 16-bit PCM (the message says how to convert it).

    """
    samples, rate = _read_int16(path)
    return samples.astype("<i2").tobytes(), rate, samples.shape[1]


def read_pcm16(path: str | Path, *, convert: bool = False) -> np.ndarray:
    """A 16-bit PCM WAV or FLAC file as mono int16 samples at the model's 16 kHz.

    Args:
        path: The file.
        convert: Downmix (channel average) and resample a file of another channel count or rate; else such a
            file is an error.

    Raises:
        ValueError: Not 16-bit PCM, or (without ``convert``) not 16 kHz mono.

    """
    samples, rate = _read_int16(path)
    channels = samples.shape[1]
    if channels == 1 and rate == MODEL_SAMPLE_RATE:
        return np.ascontiguousarray(samples[:, 0], dtype="<i2")
    if not convert:
        raise ValueError(f"{path}: expected 16 kHz mono 16-bit PCM, got {rate} Hz x {channels} channel(s)")
    x = (samples.astype(np.float32) / 32768.0).mean(axis=1)
    if rate != MODEL_SAMPLE_RATE:
        import soxr

        x = soxr.resample(x, rate, MODEL_SAMPLE_RATE)
    return (np.clip(x, -1, 1) * 32767).astype("<i2")


def read_float32(path: str | Path, *, convert: bool = False) -> np.ndarray:
    """:func:`read_pcm16` as float32 samples in [-1, 1)."""
    return read_pcm16(path, convert=convert).astype(np.float32) / 32768.0


def silence(seconds: float, sample_rate: int, num_channels: int = 1) -> bytes:
    """PCM16 silence."""
    return np.zeros(int(seconds * sample_rate) * num_channels, dtype="<i2").tobytes()


async def feed_wav(
    worker: PipelineWorker,
    path: str | Path,
    *,
    realtime: bool = True,
    trailing_silence_s: float = 1.5,
    end: bool = True,
    on_start: Callable[[], None] | None = None,
) -> float:
    """Queue a WAV file into ``worker`` as 20 ms ``InputAudioRawFrame``s, then an ``EndFrame``.

    Args:
        worker: A started pipeline worker.
        path: The WAV file.
        realtime: Pace frames against a monotonic deadline (as a microphone would); else as fast as possible.
        trailing_silence_s: Silence appended so the VAD sees the end of the last utterance, seconds.
        end: Queue an ``EndFrame`` after the audio.
        on_start: Called just before the first frame is queued (e.g. to note the wall time the audio starts).

    Returns:
        Duration of the audio fed, seconds.

    """
    from pipecat.frames.frames import EndFrame, InputAudioRawFrame

    pcm, rate, channels = read_wav(path)
    pcm += silence(trailing_silence_s, rate, channels)
    step = rate * channels * 2 * FRAME_MS // 1000
    loop = asyncio.get_running_loop()
    if on_start is not None:
        on_start()
    start = loop.time()
    for n, i in enumerate(range(0, len(pcm), step)):
        frame = InputAudioRawFrame(audio=pcm[i : i + step], sample_rate=rate, num_channels=channels)
        await worker.queue_frame(frame)
        if realtime:
            await asyncio.sleep(max(0.0, start + (n + 1) * FRAME_MS / 1000 - loop.time()))
        elif n % 25 == 0:
            await asyncio.sleep(0)
    if end:
        await worker.queue_frame(EndFrame())
    return len(pcm) / (rate * channels * 2)


async def run_worker_on_wav(
    worker: PipelineWorker,
    stt: Any,
    path: str | Path,
    *,
    realtime: bool = True,
    trailing_silence_s: float = 1.5,
    timeout_s: float | None = None,
    on_start: Callable[[], None] | None = None,
) -> None:
    """Run ``worker`` under Pipecat's ``WorkerRunner`` and feed it a WAV file, as a microphone session would.

    Feeding starts once the pipeline has started and ``stt`` is ready (its model loaded); the ``EndFrame`` after
    the audio ends the run. However it ends early (the STT cannot start, the timeout, the caller cancels), the
    pipeline is cancelled and torn down before this returns or raises: the STT's stream is closed and no
    pipeline task is left running.

    Args:
        worker: A pipeline worker not yet running.
        stt: The pipeline's STT service (``await stt.wait_until_ready()`` gates the audio).
        path: The WAV file.
        realtime: Pace frames in real time; else as fast as possible.
        trailing_silence_s: Silence appended after the audio, seconds.
        timeout_s: Give up (``TimeoutError``) after this long, seconds; None waits for the end.
        on_start: Called just before the first audio frame is queued.

    Raises:
        NemotronSTTUnavailableError: The STT could not start (its model failed to load, its server is
            unreachable); nothing was fed.
        TimeoutError: ``timeout_s`` passed.

    """
    from pipecat.pipeline.runner import WorkerRunner

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(_worker: Any, _frame: Any) -> None:
        started.set()

    async def feed() -> None:
        await started.wait()
        await stt.wait_until_ready()
        await feed_wav(
            worker, path, realtime=realtime, trailing_silence_s=trailing_silence_s, on_start=on_start
        )

    run = asyncio.ensure_future(runner.run())
    feeding = asyncio.ensure_future(feed())
    try:
        await _until_both_end(run, feeding, timeout_s)
    except BaseException:
        await _tear_down(worker, run, feeding)
        raise


async def _until_both_end(run: asyncio.Future[Any], feeding: asyncio.Future[Any], timeout_s: float | None) -> None:
    """Wait for the pipeline run and the feeding to end; raise the first error, or TimeoutError.

    Neither is cancelled here (``asyncio.wait``, not ``gather``): the caller tears the pipeline down itself.
    """
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    pending = {run, feeding}
    while pending:
        remaining = None if deadline is None else max(0.0, deadline - loop.time())
        done, pending = await asyncio.wait(pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        if not done:
            raise TimeoutError(f"the pipeline did not end within {timeout_s:g} s")
        for task in done:
            task.result()
        if run in done and feeding in pending:  # the pipeline ended early: nothing more can be fed
            feeding.cancel()
            pending.discard(feeding)


async def _tear_down(worker: PipelineWorker, run: asyncio.Future[Any], feeding: asyncio.Future[Any]) -> None:
    """Cancel the pipeline and wait until it has stopped (even while the caller is being cancelled)."""
    feeding.cancel()
    if not run.done():
        # A cancelled ``runner.run()`` returns before the pipeline's processors have stopped; a CancelFrame
        # through the pipeline stops each of them (the STT closes its stream), and ``run`` ends after that.
        await asyncio.shield(worker.cancel())
        await asyncio.shield(asyncio.wait({run}))
    await asyncio.gather(run, feeding, return_exceptions=True)
