"""Our cache-aware step of a FastConformer encoder: the same function as NeMo's, without its per-step waste.

NeMo's ``cache_aware_stream_step`` keeps, per layer and stream, the normalised *inputs* of the last
``left_context`` frames and, every step, re-projects all of them to keys and values and re-projects the
``2 (left + T) - 1`` relative positional embeddings, although neither changes between steps; its pointwise
convolutions run as ``Conv1d`` (a slow conv2d path on CPU). This step:

- caches the projected keys and values of the left context (per layer and slot) and projects only new frames;
- projects the relative positions once per chunk length (they depend on lengths only) and reuses them;
- runs the kernel-1 convolutions and the Q/K/V projections as matmuls in ``[batch, time, channel]`` layout
  (Q, K and V of the new frames in one matmul), and folds an eval-mode BatchNorm into the depthwise convolution;
- keeps the depthwise convolution's own time cache exactly as NeMo does.

It reads the loaded NeMo model's weights and configuration (any depth, width, head count, kernel or subsampling
of the family) and reuses NeMo's subsampling module. The masks and the rel-shift follow NeMo's
``ConformerEncoder.forward_internal`` so the output equals NeMo's step (fp32: to ~1e-6).

Cache layout (what the slot pool holds per layer and slot): keys and values ``[left, 2 * d_model]`` (twice the
``[left, d_model]`` layer-input cache NeMo keeps), the depthwise time cache ``[channels, kernel - 1]`` and the
number of valid cached frames.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from pipecat_nemotron.asr._nemo_private import conv_left_padding, conv_right_padding

#: Score given to masked attention positions before the softmax (NeMo's ``INF_VAL``).
_MASKED_SCORE = -10000.0


class UnsupportedEncoderError(ValueError):
    """The encoder uses a feature the fast step does not implement; ``encoder_step="nemo"`` runs it."""


@dataclass(frozen=True)
class _LayerWeights:
    """One conformer layer's parameters, shaped for the fast step (views of the model's tensors where possible)."""

    norm_ff1: Any
    ff1: Any
    norm_att: Any
    w_qkv: torch.Tensor  # [3 D, D]
    b_qkv: torch.Tensor | None
    w_out: torch.Tensor
    b_out: torch.Tensor | None
    w_pos: torch.Tensor  # [D, D]
    bias_u: torch.Tensor  # [H, d_k]
    bias_v: torch.Tensor
    norm_conv: Any
    w_pw1: torch.Tensor  # [2 C, D]
    b_pw1: torch.Tensor | None
    w_dw: torch.Tensor  # [C, 1, kernel]
    b_dw: torch.Tensor | None
    conv_norm: Any | None  # a LayerNorm over channels, or None when a BatchNorm was folded into w_dw / b_dw
    w_pw2: torch.Tensor  # [D, C]
    b_pw2: torch.Tensor | None
    conv_right_padding: int
    norm_ff2: Any
    ff2: Any
    norm_out: Any


def _check_supported(encoder: Any) -> None:
    """Raise :class:`UnsupportedEncoderError` naming the first feature the fast step lacks."""
    checks = [
        (
            getattr(encoder, "self_attention_model", None) == "rel_pos",
            "self_attention_model other than 'rel_pos'",
        ),
        (
            getattr(encoder, "att_context_style", None) == "chunked_limited",
            "att_context_style other than chunked_limited",
        ),
        (getattr(encoder, "reduction_position", None) is None, "time reduction inside the encoder"),
        (not isinstance(encoder.pre_encode, torch.nn.Linear), "a linear pre-encoder"),
    ]
    for layer in encoder.layers:
        checks += [
            (not layer.is_adapter_available(), "adapters"),
            (layer.conv.pointwise_activation == "glu_", "a pointwise activation other than GLU"),
            (
                layer.conv.norm_type in ("batch_norm", "layer_norm"),
                f"conv_norm_type={layer.conv.norm_type!r}",
            ),
        ]
    for ok, what in checks:
        if not ok:
            raise UnsupportedEncoderError(
                f"the fast encoder step does not support {what}; use encoder_step='nemo'"
            )


def _layer_weights(layer: Any) -> _LayerWeights:
    att, conv = layer.self_attn, layer.conv
    linears = (att.linear_q, att.linear_k, att.linear_v)
    w_qkv = torch.cat([m.weight for m in linears], dim=0)
    b_qkv = torch.cat([m.bias for m in linears], dim=0) if att.linear_q.bias is not None else None
    w_dw, b_dw, conv_norm = conv.depthwise_conv.weight, conv.depthwise_conv.bias, conv.batch_norm
    if conv.norm_type == "batch_norm":  # eval-mode BatchNorm is affine per channel: fold it into the conv
        bn = conv.batch_norm
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        w_dw = w_dw * scale[:, None, None]
        b_dw = (
            (b_dw if b_dw is not None else torch.zeros_like(scale)) * scale
            + bn.bias
            - bn.running_mean * scale
        )
        conv_norm = None
    return _LayerWeights(
        norm_ff1=layer.norm_feed_forward1,
        ff1=layer.feed_forward1,
        norm_att=layer.norm_self_att,
        w_qkv=w_qkv,
        b_qkv=b_qkv,
        w_out=att.linear_out.weight,
        b_out=att.linear_out.bias,
        w_pos=att.linear_pos.weight,
        bias_u=att.pos_bias_u,
        bias_v=att.pos_bias_v,
        norm_conv=layer.norm_conv,
        w_pw1=conv.pointwise_conv1.weight.squeeze(-1),
        b_pw1=conv.pointwise_conv1.bias,
        w_dw=w_dw,
        b_dw=b_dw,
        conv_norm=conv_norm,
        w_pw2=conv.pointwise_conv2.weight.squeeze(-1),
        b_pw2=conv.pointwise_conv2.bias,
        conv_right_padding=conv_right_padding(conv.depthwise_conv),
        norm_ff2=layer.norm_feed_forward2,
        ff2=layer.feed_forward2,
        norm_out=layer.norm_out,
    )


def nemo_encoder_step(
    encoder: Any,
    signal: torch.Tensor,
    lengths: torch.Tensor,
    cache_last_channel: torch.Tensor,
    cache_last_time: torch.Tensor,
    cache_last_channel_len: torch.Tensor,
    *,
    drop_extra_pre_encoded: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """NeMo's ``cache_aware_stream_step`` in the engine's call shape, every output kept.

    The encoder's current ``att_context_size`` is the mode. Returns what :meth:`FastEncoderStep.__call__`
    returns, with NeMo's layer-input cache in place of the K/V cache.
    """
    return encoder.cache_aware_stream_step(
        processed_signal=signal,
        processed_signal_length=lengths,
        cache_last_channel=cache_last_channel,
        cache_last_time=cache_last_time,
        cache_last_channel_len=cache_last_channel_len,
        keep_all_outputs=True,
        drop_extra_pre_encoded=drop_extra_pre_encoded,
    )


def _rel_shift(x: torch.Tensor) -> torch.Tensor:
    """Transformer-XL relative shift of ``[B, H, T, P]`` scores (row i moves left by ``T - 1 - i``)."""
    b, h, t, p = x.shape
    x = F.pad(x, (1, 0)).view(b, h, p + 1, t)
    return x[:, :, 1:].reshape(b, h, t, p)


class FastEncoderStep:
    """Cache-aware streaming step of a loaded NeMo FastConformer encoder, with projected K/V caches.

    Runs on the model's device and dtype; only the scheduler's worker thread calls it. Its cache state is what
    :meth:`get_initial_cache_state` returns, so NeMo's ``CacheAwareContextManager`` slot pool can hold it.

    Args:
        encoder: The model's ``ConformerEncoder`` (in eval mode).

    Raises:
        UnsupportedEncoderError: The encoder uses a feature this step does not implement.

    """

    def __init__(self, encoder: Any) -> None:
        _check_supported(encoder)
        self.encoder = encoder
        self.d_model: int = encoder.d_model
        first = encoder.layers[0].self_attn
        self.n_heads: int = first.h
        self.d_k: int = first.d_k
        #: Longest left context of the encoder's modes, encoder frames: the slot pool's cache length. A mode
        #: with a shorter one (the multilingual model's 320 ms mode, [56, 3]) is given the last frames of it.
        self.left: int = max(
            [int(c[0]) for c in getattr(encoder, "att_context_size_all", None) or []]
            + [int(encoder.streaming_cfg.last_channel_cache_size)]
        )
        self.time_cache: int = conv_left_padding(encoder.layers[0].conv.depthwise_conv)
        self.conv_channels: int = int(encoder.layers[0].conv.depthwise_conv.in_channels)
        with torch.no_grad():
            self.layers = [_layer_weights(layer) for layer in encoder.layers]
            self.w_pos_all = torch.stack([w.w_pos for w in self.layers])  # [L, D, D]
        self._positions: dict[tuple[int, int], torch.Tensor] = {}
        self._chunk_masks: dict[tuple[int, int, int], torch.Tensor] = {}

    def get_initial_cache_state(
        self, batch_size: int = 1, dtype: torch.dtype = torch.float32, device: torch.device | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Zero caches for ``batch_size`` streams (the ``CacheAwareContextManager`` protocol).

        Returns:
            Keys and values ``[layers, batch, left, 2 * d_model]``, the time cache ``[layers, batch, channels,
            kernel - 1]`` and the valid cached frames ``[batch]`` (int64).

        """
        device = device if device is not None else self.w_pos_all.device
        n = len(self.layers)
        kv = torch.zeros(n, batch_size, self.left, 2 * self.d_model, dtype=dtype, device=device)
        time_cache = torch.zeros(
            n, batch_size, self.conv_channels, self.time_cache, dtype=dtype, device=device
        )
        return kv, time_cache, torch.zeros(batch_size, dtype=torch.int64, device=device)

    def project_layer_inputs(self, cache_last_channel: torch.Tensor) -> torch.Tensor:
        """Keys and values of NeMo's layer-input cache ``[layers, batch, left, D]`` -> ``[layers, batch, left, 2 D]``.

        Lets a stream move from NeMo's step to this one (and lets tests feed both steps the same caches).
        """
        out = []
        for w, cached in zip(self.layers, cache_last_channel, strict=True):
            b = w.b_qkv[self.d_model :] if w.b_qkv is not None else None
            out.append(F.linear(cached, w.w_qkv[self.d_model :], b))
        return torch.stack(out)

    def _projected_positions(self, left: int, new_frames: int) -> torch.Tensor:
        """Per-layer projected relative positions ``[layers, heads, 2 K - 1, d_k]`` for ``K = left + new``."""
        cached = self._positions.get((left, new_frames))
        if cached is None:
            total = left + new_frames
            pos_enc = self.encoder.pos_enc
            pos_enc.extend_pe(total, self.w_pos_all.device, self.w_pos_all.dtype)
            center = pos_enc.pe.size(1) // 2 + 1
            pos_emb = pos_enc.pe[0, center - total : center + total - 1].to(self.w_pos_all.dtype)  # [2K-1, D]
            projected = torch.matmul(pos_emb, self.w_pos_all.transpose(1, 2))  # [L, 2K-1, D]
            cached = projected.view(len(self.layers), 2 * total - 1, self.n_heads, self.d_k).transpose(1, 2)
            self._positions[(left, new_frames)] = cached.contiguous()
        return cached

    def _chunk_mask(self, left: int, right_context: int, new_frames: int) -> torch.Tensor:
        """NeMo's chunked-limited visibility of new frames (rows) over cached + new frames (cols): ``[T, K]``.

        As in NeMo's streaming step, chunks are counted from the first cached frame (the mode's left context
        is a whole number of chunks) and a chunk sees ``left // (right + 1)`` chunks back.
        """
        key = (left, right_context, new_frames)
        mask = self._chunk_masks.get(key)
        if mask is None:
            chunk = right_context + 1
            left_chunks = left // chunk
            index = torch.arange(left + new_frames, device=self.w_pos_all.device) // chunk
            diff = index[left:, None] - index[None, :]
            mask = (diff >= 0) & (diff <= left_chunks)
            self._chunk_masks[key] = mask
        return mask

    def __call__(
        self,
        signal: torch.Tensor,
        lengths: torch.Tensor,
        kv_cache: torch.Tensor,
        time_cache: torch.Tensor,
        cached_frames: torch.Tensor,
        *,
        drop_extra_pre_encoded: int,
        right_context: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step for a batch of streams.

        Args:
            signal: Mel features ``[B, features, frames]`` (pre-encode cache prepended by the caller).
            lengths: Valid mel frames per stream ``[B]``.
            kv_cache: ``[layers, B, left, 2 D]``, ``left`` the mode's left context (see :attr:`left`).
            time_cache: ``[layers, B, channels, kernel - 1]``.
            cached_frames: Valid cached frames per stream ``[B]`` (0 for a new stream).
            drop_extra_pre_encoded: Encoder frames to drop from the subsampling output (0 on a first chunk).
            right_context: The latency mode's right attention context, encoder frames.

        Returns:
            Encoder output ``[B, D, T]``, its lengths ``[B]``, and the next K/V cache, time cache and valid
            cached frames (same shapes as given).

        """
        x, length = self.encoder.pre_encode(x=signal.transpose(1, 2), lengths=lengths)
        length = length.to(torch.int64)
        if drop_extra_pre_encoded > 0:
            x = x[:, drop_extra_pre_encoded:, :]
            length = (length - drop_extra_pre_encoded).clamp(min=0)
        new_frames = x.size(1)
        if self.encoder.xscale:
            x = x * self.encoder.xscale
        left = kv_cache.size(2)
        positions = self._projected_positions(left, new_frames)
        cols = torch.arange(left + new_frames, device=x.device)
        valid_cols = (cols[None, :] >= (left - cached_frames)[:, None]) & (
            cols[None, :] < (left + length)[:, None]
        )
        valid_rows = valid_cols[:, left:]
        visible = (
            valid_rows[:, :, None]
            & valid_cols[:, None, :]
            & self._chunk_mask(left, right_context, new_frames)
        )
        att_mask = ~visible[:, None]  # [B, 1, T, K]
        pad_mask = ~valid_rows[:, :, None]  # [B, T, 1]
        kv_next = torch.empty_like(kv_cache)
        time_next = torch.empty_like(time_cache)
        for i, w in enumerate(self.layers):
            x, kv_next[i], time_next[i] = self._layer(
                w, x, positions[i], att_mask, pad_mask, kv_cache[i], time_cache[i]
            )
        if self.encoder.out_proj is not None:
            x = self.encoder.out_proj(x)
        next_cached = torch.clamp(cached_frames + new_frames, max=left)
        return x.transpose(1, 2), length, kv_next, time_next, next_cached

    def _layer(
        self,
        w: _LayerWeights,
        x: torch.Tensor,
        positions: torch.Tensor,
        att_mask: torch.Tensor,
        pad_mask: torch.Tensor,
        kv_cache: torch.Tensor,
        time_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        residual = x + 0.5 * w.ff1(w.norm_ff1(x))
        attended, kv_next = self._attention(w, w.norm_att(residual), positions, att_mask, kv_cache)
        residual = residual + attended
        conv, time_next = self._convolution(w, w.norm_conv(residual), pad_mask, time_cache)
        residual = residual + conv
        residual = residual + 0.5 * w.ff2(w.norm_ff2(residual))
        return w.norm_out(residual), kv_next, time_next

    def _attention(
        self,
        w: _LayerWeights,
        x: torch.Tensor,
        positions: torch.Tensor,
        att_mask: torch.Tensor,
        kv_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch, new_frames, d = x.shape
        qkv = F.linear(x, w.w_qkv, w.b_qkv)  # [B, T, 3 D]
        kv_all = torch.cat((kv_cache, qkv[:, :, d:]), dim=1)  # [B, K, 2 D]
        total = kv_all.size(1)
        heads = kv_all.view(batch, total, 2, self.n_heads, self.d_k)
        k = heads[:, :, 0].transpose(1, 2)  # [B, H, K, d_k]
        v = heads[:, :, 1].transpose(1, 2)
        q = qkv[:, :, :d].view(batch, new_frames, self.n_heads, self.d_k)
        matrix_ac = torch.matmul((q + w.bias_u).transpose(1, 2), k.transpose(-2, -1))  # [B, H, T, K]
        matrix_bd = torch.matmul(
            (q + w.bias_v).transpose(1, 2), positions.transpose(-2, -1)
        )  # [B, H, T, 2K-1]
        matrix_bd = _rel_shift(matrix_bd)[..., :total]
        scores = (matrix_ac + matrix_bd) / math.sqrt(self.d_k)
        scores = scores.masked_fill(att_mask, _MASKED_SCORE)
        attn = torch.softmax(scores, dim=-1).masked_fill(att_mask, 0.0)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(batch, new_frames, d)
        return F.linear(out, w.w_out, w.b_out), kv_all[:, -kv_cache.size(1) :]

    def _convolution(
        self, w: _LayerWeights, x: torch.Tensor, pad_mask: torch.Tensor, time_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.glu(F.linear(x, w.w_pw1, w.b_pw1), dim=-1)  # [B, T, C]
        x = x.masked_fill(pad_mask, 0.0).transpose(1, 2)  # [B, C, T]
        if w.conv_right_padding:
            x = F.pad(x, (0, w.conv_right_padding))
        x = torch.cat((time_cache, x), dim=-1)
        time_next = x[:, :, x.size(-1) - time_cache.size(-1) :]
        x = F.conv1d(x, w.w_dw, w.b_dw, groups=x.size(1)).transpose(1, 2)  # [B, T, C]
        if w.conv_norm is not None:
            x = w.conv_norm(x)
        return F.linear(F.silu(x), w.w_pw2, w.b_pw2), time_next
