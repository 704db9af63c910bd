"""The ASR side's reaches into NeMo's private attributes, in one place (as ``tts/magpie/_nemo_private.py``).

Our fast encoder step and the sherpa-onnx export need three numbers NeMo keeps on private attributes: the causal
depthwise convolution's left and right padding (``CausalConv1D._left_padding`` / ``_right_padding``, the conv
cache length and the look-ahead), and the encoder's input feature count (``ConformerEncoder._feat_in``). Each
accessor fails with a message naming the NeMo class and attribute when a NeMo release renames it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["conv_left_padding", "conv_right_padding", "encoder_feat_in"]


def _read(obj: Any, name: str) -> int:
    try:
        return int(getattr(obj, name))
    except AttributeError as e:
        raise RuntimeError(
            f"NeMo's {type(obj).__name__} has no {name!r}: this NeMo release is not supported by the fast step "
            "(pin nemo_toolkit 3.0.x, or use EngineConfig(encoder_step='nemo'))"
        ) from e


def conv_left_padding(depthwise_conv: Any) -> int:
    """Frames a causal depthwise convolution keeps on its left (its ``cache_last_time`` length)."""
    return _read(depthwise_conv, "_left_padding")


def conv_right_padding(depthwise_conv: Any) -> int:
    """Frames of look-ahead a depthwise convolution pads on its right (0 when fully causal)."""
    return _read(depthwise_conv, "_right_padding")


def encoder_feat_in(encoder: Any) -> int:
    """Mel features per frame the encoder takes."""
    return _read(encoder, "_feat_in")
