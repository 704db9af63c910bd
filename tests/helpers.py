"""Helpers shared by tests (import from tests.helpers)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import numpy as np
import torch

from pipecat_nemotron.bench.audio import wait_caught_up  # noqa: F401  (tests import it from here)
from pipecat_nemotron.engine import ASRStream, NemotronEngine


def offline_decode(
    engine: NemotronEngine, audio: np.ndarray, latency_ms: int, language: str | None = None
) -> tuple[list[int], torch.Tensor]:
    """Whole-clip (non-streaming) decode with the same attention context: tokens and encoder output [D, T].

    On a multilingual model ``language`` (a prompt key) goes through NeMo's own ``forward(prompt_indices=...)``.
    Runs the engine's model on the calling thread, so call it while no stream is being decoded; the encoder's
    attention context is restored afterwards (the engine's worker thread sets it only when it changes).
    """
    from pipecat_nemotron.engine.modes import model_latency_modes

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
