"""Latency modes of a loaded model: which it has (its ``att_context_size`` list) and each one's chunk geometry.

A mode of right attention context ``R`` (80 ms encoder frames) is a ``(R + 1) * 80`` ms mode. The English model
has ``[70, 13] [70, 6] [70, 1] [70, 0]`` (1120, 560, 160, 80 ms); the multilingual one adds ``[56, 3]`` (320 ms),
whose left context is shorter than the slot pool's 70 frames: its steps read the last 56 (:func:`tail_context`)
and their next caches are padded back (:func:`left_pad`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pipecat_nemotron.asr.config import ENCODER_FRAME_MS, LATENCY_MODES, LEFT_CONTEXT_FRAMES


@dataclass(frozen=True)
class ModeShape:
    """Chunk geometry of one latency mode, read from NeMo's ``encoder.streaming_cfg``.

    Attributes:
        latency_ms: The mode.
        left_context: Left attention context, encoder frames (the length of the cache the step is given).
        right_context: Right attention context, encoder frames.
        first_chunk_frames: Mel frames of a stream's first chunk (no pre-encode cache).
        chunk_frames: Mel frames of every later chunk.
        pre_encode_cache_frames: Mel frames of the previous chunk prepended to later chunks.
        drop_extra_pre_encoded: Encoder frames dropped from later chunks' subsampling output.

    """

    latency_ms: int
    left_context: int
    right_context: int
    first_chunk_frames: int
    chunk_frames: int
    pre_encode_cache_frames: int
    drop_extra_pre_encoded: int


def model_latency_modes(encoder: Any) -> dict[int, tuple[int, int]]:
    """The latency modes an encoder was trained for: ``{chunk ms: (left, right context in encoder frames)}``.

    Read from its ``att_context_size`` list (a mode of right context ``R`` is ``(R + 1) * 80`` ms; the first
    context listed for a chunk length wins). An encoder without that list (not multi-lookahead) gets the
    English model's table.
    """
    contexts = [tuple(int(v) for v in c) for c in getattr(encoder, "att_context_size_all", None) or []]
    if not contexts:
        return {ms: (LEFT_CONTEXT_FRAMES, right) for ms, right in LATENCY_MODES.items()}
    modes: dict[int, tuple[int, int]] = {}
    for left, right in contexts:
        if left < 0 or right < 0:
            continue  # unlimited context: not streamable with a fixed cache
        modes.setdefault((right + 1) * ENCODER_FRAME_MS, (left, right))
    return dict(sorted(modes.items()))


def tail_context(context: Any, left: int) -> Any:
    """The slot caches as a mode of left context ``left`` sees them: the last ``left`` cached frames."""
    from nemo.collections.asr.inference.utils.context_manager import CacheAwareContext

    channel = context.cache_last_channel
    if channel is None or channel.size(2) == left:
        return context
    return CacheAwareContext(
        channel[:, :, channel.size(2) - left :],
        context.cache_last_time,
        torch.clamp(context.cache_last_channel_len, max=left),
    )


def left_pad(channel: torch.Tensor, size: int) -> torch.Tensor:
    """A mode's next attention cache ``[layers, B, left, ...]`` back at the slot pool's length.

    The zeros go first: the valid-frame count never reaches them.
    """
    missing = size - channel.size(2)
    if missing <= 0:
        return channel
    pad = channel.new_zeros(channel.size(0), channel.size(1), missing, *channel.shape[3:])
    return torch.cat((pad, channel), dim=2)


def mode_shapes(encoder: Any) -> dict[int, ModeShape]:
    """The chunk geometry of each of the encoder's modes, read from NeMo's ``streaming_cfg`` per mode.

    Leaves the encoder's attention context at the last mode; the caller sets the one it needs.
    """
    modes: dict[int, ModeShape] = {}
    for latency_ms, (left, right) in model_latency_modes(encoder).items():
        encoder.set_default_att_context_size([left, right])
        cfg = encoder.streaming_cfg
        modes[latency_ms] = ModeShape(
            latency_ms=latency_ms,
            left_context=left,
            right_context=right,
            # A first chunk shorter than the pre-encode cache (1 frame in the 80 ms mode) would leave zero
            # padding in the next chunk's cache and shift its encoder output away from the offline model's;
            # starting with a chunk that fills the cache keeps streaming equal to offline.
            first_chunk_frames=max(int(cfg.chunk_size[0]), int(cfg.pre_encode_cache_size[1])),
            chunk_frames=int(cfg.chunk_size[1]),
            pre_encode_cache_frames=int(cfg.pre_encode_cache_size[1]),
            drop_extra_pre_encoded=int(cfg.drop_extra_pre_encoded),
        )
    return modes
