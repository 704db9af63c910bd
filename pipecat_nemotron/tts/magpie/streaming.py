"""Incremental codec decoding: audio for new codec frames, exactly as a whole-utterance decode would give it.

Magpie's codec decoder is causal: the audio of frame ``t`` depends on frames ``t - R .. t`` only, ``R`` being the
decoder's receptive field in frames. So a prefix of frames decodes to a prefix of the full decode. Two ways to
decode the audio of new frames:

- with a :class:`~pipecat_nemotron.tts.magpie.codec_stream.CodecState` (the default where the codec is supported):
  each convolution's last inputs are kept per request, so a chunk decodes its new frames only;
- otherwise, decode them together with the ``R`` frames before them and keep the new part: each chunk costs one
  decode of ``R + chunk`` frames. ``R`` is measured on the loaded codec by :func:`measure_decoder_context`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pipecat_nemotron.tts.magpie.options import chunk_frames_at

DecodeFn = Callable[[torch.Tensor], torch.Tensor]
"""Decodes codes ``(num_codebooks, T)`` to float audio ``(T * samples_per_frame,)``."""


DecodeBatchFn = Callable[[torch.Tensor, torch.Tensor, "list[object | None]"], list[torch.Tensor]]
"""Decodes codes ``(B, num_codebooks, T)`` with lengths ``(B,)`` (after each row's codec state, if any; the states
advance) to each item's float audio. A state is opaque here: the decode function's own
(:class:`~pipecat_nemotron.tts.magpie.codec_stream.CodecState`)."""


@dataclass(frozen=True)
class DecoderProbe:
    """What :func:`measure_decoder_context` found out about a codec decoder.

    Attributes:
        context_frames: Frames before a chunk needed to decode it exactly (the receptive field), or None when it
            reaches past the probe (decode the whole prefix instead).
        causal: Whether a frame's audio is independent of later frames (required for exact streaming).

    """

    context_frames: int | None
    causal: bool


def measure_decoder_context(
    decode: DecodeFn,
    *,
    num_codebooks: int,
    codebook_size: int,
    samples_per_frame: int,
    device: torch.device,
    probe_frames: int = 96,
    margin_frames: int = 2,
) -> DecoderProbe:
    """Measure a codec decoder's receptive field and causality by perturbing single frames.

    Changing frame 0 changes the audio of frames ``0 .. R`` only; changing the last frame must not change earlier
    audio if the decoder is causal. Audio is compared exactly: beyond the receptive field the computation is the
    same, so any difference, however small, is a dependency. (A backend whose convolution algorithms spread rounding
    noise across positions makes the field look unbounded: whole prefixes are then decoded, which is exact but
    slower, and the engine logs it.)

    Args:
        decode: The codec decode function.
        num_codebooks: Codebooks per frame.
        codebook_size: Codes per codebook (valid ids are below this).
        samples_per_frame: Audio samples per frame.
        device: Device to build the probe codes on.
        probe_frames: Length of the probe sequence, in frames.
        margin_frames: Frames added to the measured field, in case the probe misses a dependency.

    Returns:
        The measured :class:`DecoderProbe`.

    """
    generator = torch.Generator().manual_seed(0)
    codes = torch.randint(0, codebook_size, (num_codebooks, probe_frames), generator=generator).to(device)
    base = decode(codes)

    changed_last = codes.clone()
    changed_last[:, -1] = (changed_last[:, -1] + 1) % codebook_size
    earlier = (probe_frames - 1) * samples_per_frame
    causal = torch.equal(decode(changed_last)[:earlier], base[:earlier])

    changed_first = codes.clone()
    changed_first[:, 0] = (changed_first[:, 0] + 1) % codebook_size
    affected = torch.nonzero(decode(changed_first) != base)
    last_affected_frame = int(affected.max()) // samples_per_frame if affected.numel() else 0
    context = last_affected_frame + margin_frames
    return DecoderProbe(context_frames=None if context >= probe_frames - 1 else context, causal=causal)


def to_int16(audio: torch.Tensor) -> np.ndarray:
    """Convert float audio in [-1, 1] (any device) to int16 PCM on the CPU."""
    return (audio.clamp(-1.0, 1.0) * 32767.0).round().to(torch.int16).cpu().numpy()


class StreamingDecoder:
    """Turns codec frames, pushed one at a time, into int16 audio chunks.

    The first chunk is emitted after ``first_chunk_frames`` frames, later ones every ``chunk_frames`` frames (or
    doubling from there up to ``max_chunk_frames``), and :meth:`flush` emits the rest. Concatenated, the chunks
    equal the decode of all frames at once (to one int16 step: float rounding only) when the decoder is causal and
    ``context_frames`` covers its receptive field (or the decoder has a codec state).
    """

    def __init__(
        self,
        decode_batch: DecodeBatchFn,
        *,
        samples_per_frame: int,
        context_frames: int | None,
        first_chunk_frames: int,
        chunk_frames: int,
        max_chunk_frames: int | None = None,
        state: object | None = None,
    ) -> None:
        """Create a decoder for one utterance.

        Args:
            decode_batch: The batched codec decode function (also used for this decoder alone).
            samples_per_frame: Audio samples per codec frame.
            context_frames: Frames of left context decoded with each chunk; None decodes the whole prefix.
                Ignored with ``state``.
            first_chunk_frames: Frames in the first chunk.
            chunk_frames: Frames in the second chunk (and each later one without ``max_chunk_frames``).
            max_chunk_frames: Each later chunk doubles the previous one's frames up to this cap (None: no growth).
            state: The utterance's codec history (opaque here, ``decode_batch``'s): each chunk then decodes only its
                new frames.

        """
        self._decode_batch = decode_batch
        self._samples_per_frame = samples_per_frame
        self._context_frames = 0 if state is not None else context_frames
        self.state = state
        self._first_chunk_frames = first_chunk_frames
        self._chunk_frames = chunk_frames
        self._max_chunk_frames = max_chunk_frames
        self._frames: list[torch.Tensor] = []
        self._emitted = 0
        self._chunks = 0

    @property
    def frames(self) -> int:
        """Frames pushed so far."""
        return len(self._frames)

    @property
    def emitted_frames(self) -> int:
        """Frames whose audio has been emitted."""
        return self._emitted

    def push(self, frame: torch.Tensor) -> np.ndarray | None:
        """Add one frame of codes, shape ``(num_codebooks,)``; return a chunk when one is due.

        Returns:
            int16 audio of the frames not yet emitted, or None.

        """
        return self.flush() if self.append(frame) else None

    def append(self, frame: torch.Tensor) -> bool:
        """Add one frame of codes ``(num_codebooks,)`` without decoding; return whether a chunk is now due."""
        self._frames.append(frame)
        due = chunk_frames_at(self._chunks, self._first_chunk_frames, self._chunk_frames, self._max_chunk_frames)
        return len(self._frames) - self._emitted >= due

    def flush(self) -> np.ndarray | None:
        """Decode and return the audio of all frames not yet emitted (None if there are none)."""
        return flush_together(self._decode_batch, [self])[0]

    def segment(self) -> torch.Tensor | None:
        """Codes ``(num_codebooks, L)`` to decode for the frames not yet emitted (with their left context)."""
        if len(self._frames) == self._emitted:
            return None
        return torch.stack(self._frames[self._start() :], dim=-1)

    def take(self, audio: torch.Tensor) -> np.ndarray:
        """Given the float audio of :meth:`segment`, mark its frames emitted and return their new int16 audio."""
        new_audio = audio[(self._emitted - self._start()) * self._samples_per_frame :]
        self._chunks += 1
        self._emitted = len(self._frames)
        return to_int16(new_audio)

    def _start(self) -> int:
        return 0 if self._context_frames is None else max(0, self._emitted - self._context_frames)


def flush_together(decode_batch: DecodeBatchFn, decoders: Sequence[StreamingDecoder]) -> list[np.ndarray | None]:
    """:meth:`StreamingDecoder.flush` of many decoders in one codec call (segments right-padded to the longest).

    The codec decoder is causal, so padding after a segment does not change its audio: each result equals the
    decoder's own flush. Decoders with a codec state decode their new frames after their own history.

    Returns:
        Per decoder, its new int16 audio (None for one with nothing to emit).

    """
    segments = [d.segment() for d in decoders]
    present = [i for i, seg in enumerate(segments) if seg is not None]
    results: list[np.ndarray | None] = [None] * len(decoders)
    if not present:
        return results
    lens = [segments[i].shape[-1] for i in present]  # type: ignore[union-attr]
    first = segments[present[0]]
    assert first is not None
    codes = first.new_zeros(len(present), first.shape[0], max(lens))
    for k, i in enumerate(present):
        codes[k, :, : lens[k]] = segments[i]
    states = [decoders[i].state for i in present]
    audio = decode_batch(codes, torch.tensor(lens, device=codes.device), states)
    for k, i in enumerate(present):
        results[i] = decoders[i].take(audio[k])
    return results
