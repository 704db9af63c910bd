"""Feeding a WAV file into a Pipecat pipeline as if a user were speaking it (demo, examples, tests)."""

from __future__ import annotations

import asyncio
import wave
from pathlib import Path

import numpy as np
from pipecat.frames.frames import EndFrame, InputAudioRawFrame
from pipecat.pipeline.worker import PipelineWorker

#: Audio per frame, ms (what transports deliver).
FRAME_MS = 20


def read_wav(path: str | Path) -> tuple[bytes, int, int]:
    """Read a PCM16 WAV file.

    Returns:
        ``(pcm16 bytes, sample_rate Hz, num_channels)``.

    Raises:
        ValueError: Not 16-bit PCM (the message says how to convert it).

    """
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: expected 16-bit PCM WAV; convert with `sox in.wav -b 16 out.wav`")
        return w.readframes(w.getnframes()), w.getframerate(), w.getnchannels()


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
) -> float:
    """Queue a WAV file into ``worker`` as 20 ms ``InputAudioRawFrame``s, then an ``EndFrame``.

    Args:
        worker: A started pipeline worker.
        path: The WAV file.
        realtime: Pace frames against a monotonic deadline (as a microphone would); else as fast as possible.
        trailing_silence_s: Silence appended so the VAD sees the end of the last utterance, seconds.
        end: Queue an ``EndFrame`` after the audio.

    Returns:
        Duration of the audio fed, seconds.

    """
    pcm, rate, channels = read_wav(path)
    pcm += silence(trailing_silence_s, rate, channels)
    step = rate * channels * 2 * FRAME_MS // 1000
    loop = asyncio.get_running_loop()
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
