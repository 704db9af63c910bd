"""Turning whatever audio a caller pushes into float32 mono samples at the model's 16 kHz rate."""

from __future__ import annotations

import numpy as np

#: The model's sample rate, Hz.
MODEL_SAMPLE_RATE = 16000

#: Samples of model-rate audio per millisecond.
SAMPLES_PER_MS = MODEL_SAMPLE_RATE / 1000.0

#: Input rates accepted besides 16 kHz (resampled), Hz.
SUPPORTED_SAMPLE_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)

_INT16_SCALE = 1.0 / 32768.0


class AudioInput:
    """Per-stream input converter: int16 PCM bytes or float arrays in, 16 kHz float32 mono out.

    Keeps the state a byte stream needs across pushes: a trailing odd byte (half an int16 sample) or a
    partial multi-channel frame is carried into the next push, never dropped; resampling is streaming
    (soxr keeps its filter history), so chunk boundaries do not click.
    """

    def __init__(self) -> None:
        self._carry = b""
        self._carry_key: tuple[int, int] | None = None
        self._resampler = None
        self._resampler_rate: int | None = None

    def convert(
        self, audio: bytes | bytearray | memoryview | np.ndarray, sample_rate: int, num_channels: int
    ) -> np.ndarray:
        """Convert one pushed buffer.

        Args:
            audio: Little-endian int16 PCM bytes (interleaved when ``num_channels`` > 1), or a numpy array of
                int16 samples or float samples in [-1, 1], shaped ``[samples]`` or ``[samples, channels]``.
            sample_rate: Rate of ``audio``, Hz.
            num_channels: Interleaved channels in ``audio`` (downmixed by averaging).

        Returns:
            float32 mono samples at 16 kHz (possibly empty).

        Raises:
            InvalidAudioError: Unsupported rate or channel count, or NaN/inf in float input.

        """
        from pipecat_nemotron.asr.errors import InvalidAudioError

        if sample_rate not in SUPPORTED_SAMPLE_RATES:
            raise InvalidAudioError(
                f"sample_rate must be one of {list(SUPPORTED_SAMPLE_RATES)} Hz, got {sample_rate!r}"
            )
        if not isinstance(num_channels, int) or not 1 <= num_channels <= 8:
            raise InvalidAudioError(f"num_channels must be an int from 1 to 8, got {num_channels!r}")
        if isinstance(audio, np.ndarray):
            samples = self._from_array(audio, num_channels)
        elif isinstance(audio, (bytes, bytearray, memoryview)):
            samples = self._from_bytes(bytes(audio), sample_rate, num_channels)
        else:
            raise InvalidAudioError(
                f"audio must be bytes (int16 PCM) or a numpy array, got {type(audio).__name__}"
            )
        if samples.size == 0:
            return samples
        return self._resample(samples, sample_rate)

    def _from_bytes(self, data: bytes, sample_rate: int, num_channels: int) -> np.ndarray:
        key = (sample_rate, num_channels)
        if self._carry and self._carry_key != key:
            self._carry = b""  # a format change restarts the byte stream
        self._carry_key = key
        data = self._carry + data
        frame_bytes = 2 * num_channels
        usable = len(data) - len(data) % frame_bytes
        self._carry = data[usable:]
        pcm = np.frombuffer(data[:usable], dtype="<i2").astype(np.float32) * _INT16_SCALE
        if num_channels > 1:
            pcm = pcm.reshape(-1, num_channels).mean(axis=1)
        return pcm

    @staticmethod
    def _from_array(audio: np.ndarray, num_channels: int) -> np.ndarray:
        from pipecat_nemotron.asr.errors import InvalidAudioError

        if audio.dtype == np.int16:
            pcm = audio.astype(np.float32) * _INT16_SCALE
        elif np.issubdtype(audio.dtype, np.floating):
            pcm = audio.astype(np.float32, copy=False)
            if not np.isfinite(pcm).all():
                raise InvalidAudioError("float audio contains NaN or inf samples")
        else:
            raise InvalidAudioError(f"numpy audio must be int16 or float, got dtype {audio.dtype}")
        if pcm.ndim == 2:
            if pcm.shape[1] != num_channels:
                raise InvalidAudioError(
                    f"array has {pcm.shape[1]} channels (shape {pcm.shape}) but num_channels={num_channels}"
                )
            pcm = pcm.mean(axis=1)
        elif pcm.ndim == 1 and num_channels > 1:
            usable = pcm.size - pcm.size % num_channels
            pcm = pcm[:usable].reshape(-1, num_channels).mean(axis=1)
        elif pcm.ndim != 1:
            raise InvalidAudioError(f"audio array must be 1-D or [samples, channels], got shape {pcm.shape}")
        return np.ascontiguousarray(pcm, dtype=np.float32)

    def _resample(self, samples: np.ndarray, sample_rate: int) -> np.ndarray:
        if sample_rate == MODEL_SAMPLE_RATE:
            return samples
        import soxr

        if self._resampler is None or self._resampler_rate != sample_rate:
            self._resampler = soxr.ResampleStream(
                sample_rate, MODEL_SAMPLE_RATE, 1, dtype="float32", quality="HQ"
            )
            self._resampler_rate = sample_rate
        return self._resampler.resample_chunk(samples)

    def flush(self) -> np.ndarray:
        """Return the samples the resampler still holds (call at the end of an utterance)."""
        if self._resampler is None:
            return np.zeros(0, dtype=np.float32)
        out = self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
        self._resampler = None
        self._resampler_rate = None
        return out
