"""Helpers shared by tests (import from tests.helpers)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

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
    from pipecat_nemotron.magpie import MagpieSynthesisOptions

    return MagpieSynthesisOptions(
        max_duration_s=(frames - 0.5) * MAGPIE_SAMPLES_PER_FRAME / MAGPIE_CODEC_RATE, **kwargs
    )

