"""Stateful streaming codec decode: each audio chunk decodes only its new codec frames.

Magpie's codec decoder (NeMo's ``CausalHiFiGANDecoder``, in the tiny test codec and in the released nano codec) is a
stack of causal convolutions, transposed convolutions that upsample, and point-wise activations. A causal
convolution of kernel ``k`` and dilation ``d`` pads its input on the left with ``(k - 1) * d`` zeros; a transposed
convolution of stride ``s`` and kernel ``k`` (all its padding trimmed on the right) needs the ``ceil((k - s) / s)``
inputs before the new ones. So a request's history is, per convolution, its last few input samples:
:class:`CodecState`. Decoding a chunk with that history in place of the zero padding gives the samples a
whole-utterance decode gives (float rounding aside), at the cost of the new frames only, where re-decoding
``R`` frames of left context with each ``n``-frame chunk costs ``R + n`` (``R`` = 15 on the tiny codec).

Rows with different histories and chunk lengths decode together: each row's history is stacked in, the rows are
right-padded to the longest (causal layers: padding after a row does not change its samples), and each row's new
history is gathered at its own length.

Why our own forward: NeMo's decoder has no streaming state (its ``forward`` takes whole sequences), so we run its
modules' own convolutions and activations in the same order, feeding each the kept history.
:func:`unsupported_reason` checks the structure first; a codec it does not know is decoded as before (context
re-decode), never approximated.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from loguru import logger

from pipecat_nemotron.tts.magpie._nemo_private import codec_parts, is_batch_norm

if TYPE_CHECKING:
    from pipecat_nemotron.tts.magpie.options import MagpieSynthesisOptions
    from pipecat_nemotron.tts.magpie.streaming import StreamingDecoder


class CodecState:
    """One request's codec history: per convolution of the decoder, the last inputs it saw (one utterance).

    Attributes:
        buffers: Per convolution, in call order, a tensor ``(channels, width)``; None before the first chunk
            (the decoder then sees the zeros a whole-utterance decode pads with).

    """

    __slots__ = ("buffers",)

    def __init__(self) -> None:
        """An empty history (the start of an utterance)."""
        self.buffers: list[torch.Tensor] | None = None


def unsupported_reason(model: Any) -> str | None:
    """Why :class:`StreamingCodec` cannot decode ``model``'s codec exactly (None: it can).

    Args:
        model: A loaded ``MagpieTTSModel``.

    """
    from nemo.collections.tts.models import AudioCodecModel

    codec, _converter = codec_parts(model)
    if not isinstance(codec, AudioCodecModel):
        return f"a codec of type {type(codec).__name__}"
    for method in ("decode", "decode_audio", "dequantize"):
        owner = next(k for k in type(codec).__mro__ if method in vars(k))
        if owner is not AudioCodecModel:
            return f"a codec that overrides {method}()"
    return decoder_unsupported_reason(codec.audio_decoder)


def decoder_unsupported_reason(decoder: torch.nn.Module) -> str | None:
    """Why :func:`decode_latents` cannot stream ``decoder`` exactly (None: it can).

    Args:
        decoder: A codec's ``audio_decoder``.

    """
    from nemo.collections.tts.modules import audio_codec_modules as acm

    if type(decoder) is not acm.CausalHiFiGANDecoder:
        return f"a codec decoder of type {type(decoder).__name__}"
    for layer in decoder.res_layers:  # The structure decode_latents walks, exactly.
        blocks = [res for block in getattr(layer, "res_blocks", []) for res in getattr(block, "res_blocks", [])]
        if type(layer) is not acm.HiFiGANResLayer or any(type(res) is not acm.ResidualBlock for res in blocks):
            return f"a residual layer of type {type(layer).__name__} holding other than HiFi-GAN residual blocks"
    for name, module in decoder.named_modules():
        reason = _module_reason(module, acm)
        if reason is not None:
            return f"{reason} ({name})"
    return None


def _module_reason(module: torch.nn.Module, acm: Any) -> str | None:
    """Why one decoder submodule breaks the streaming equivalence (None: it does not)."""
    if isinstance(module, acm.CausalConv1dNorm):
        conv = module.conv
        if conv.stride[0] != 1 or conv.padding[0] != 0 or module.extra_pad_mode != "constant":
            return "a causal convolution with a stride, built-in padding or non-zero padding"
    elif isinstance(module, acm.CausalConvTranspose1dNorm):
        conv = module.conv
        if module.padding_left != 0 or conv.padding[0] != 0 or conv.output_padding[0] != 0 or conv.dilation[0] != 1:
            return "a transposed convolution trimmed on the left"
    elif isinstance(module, acm.ResidualBlock):
        if not isinstance(module.input_conv, acm.CausalConv1dNorm):
            return "a non-causal residual block"
    elif isinstance(module, (acm.Conv1dNorm, acm.ConvTranspose1dNorm)) or is_batch_norm(module):
        return f"a non-causal {type(module).__name__}"
    return None


class StreamingCodec:
    """Decodes codec frames chunk by chunk, each request carrying its :class:`CodecState` (engine thread only)."""

    def __init__(self, model: Any) -> None:
        """Bind to a loaded ``MagpieTTSModel`` whose codec :func:`unsupported_reason` accepts.

        Raises:
            ValueError: The codec is not supported (the message says why).

        """
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the stateful codec decode does not support {reason}")
        self._codec, self._converter = codec_parts(model)

    def decode(self, codes: torch.Tensor, lens: torch.Tensor, states: Sequence[CodecState]) -> list[torch.Tensor]:
        """Decode each row's new frames after its history, and advance the histories.

        Args:
            codes: New codes ``(B, num_codebooks, T)``, row ``i`` right-padded after ``lens[i]`` frames.
            lens: New frames per row ``(B,)`` (each at least 1).
            states: Each row's history, updated in place.

        Returns:
            Each row's float audio for its new frames, ``(lens[i] * samples_per_frame,)``, on the codec's device.

        """
        lens = lens.to(codes.device)
        # fp32 as NeMo's codes_to_audio decodes (autocast exists on CUDA only; CPU code here is fp32 already).
        cuda = codes.device.type == "cuda"
        with torch.no_grad(), torch.autocast(device_type=codes.device.type, dtype=torch.float32, enabled=cuda):
            if self._converter is not None:
                codes = self._converter.convert_new_to_original(audio_tokens=codes, audio_lens=lens)
            inputs = self._codec.dequantize(tokens=codes, tokens_len=lens)
            return decode_latents(self._codec.audio_decoder, inputs, lens, states)


def decode_latents(
    decoder: Any, inputs: torch.Tensor, lens: torch.Tensor, states: Sequence[CodecState]
) -> list[torch.Tensor]:
    """``CausalHiFiGANDecoder.forward`` on new frames, each convolution fed its row's kept history.

    Args:
        decoder: A decoder :func:`decoder_unsupported_reason` accepts.
        inputs: New latent frames ``(B, D, T)``, row ``i`` right-padded after ``lens[i]`` frames.
        lens: New frames per row ``(B,)``, on the inputs' device.
        states: Each row's history, advanced in place.

    Returns:
        Each row's audio for its new frames.

    """
    run = _Pass([s.buffers for s in states], lens)
    x = run.conv(decoder.pre_conv, inputs)
    for act, res_layer, up_sample_conv in zip(
        decoder.activations, decoder.res_layers, decoder.up_sample_conv_layers, strict=True
    ):
        x = run.conv_transpose(up_sample_conv, act(x))
        residuals = [_res_block(block, x, run) for block in res_layer.res_blocks]
        x = sum(residuals) / len(residuals)
    audio = decoder.out_activation(run.conv(decoder.post_conv, decoder.post_activation(x)))[:, 0]
    for state, buffers in zip(states, run.row_buffers(), strict=True):
        state.buffers = buffers
    return [audio[i, : int(n)] for i, n in enumerate(run.lens.tolist())]


def _res_block(block: Any, x: torch.Tensor, run: _Pass) -> torch.Tensor:
    """``HiFiGANResBlock.forward``: its ``ResidualBlock`` s in sequence."""
    for res in block.res_blocks:
        skip = run.conv(res.input_conv, res.input_activation(x))
        skip = run.conv(res.skip_conv, res.skip_activation(skip))
        x = x + res.dropout(skip)
    return x


class _Pass:
    """One batched decode call: reads each convolution's history in call order and gathers the new one."""

    def __init__(self, old: list[list[torch.Tensor] | None], lens: torch.Tensor) -> None:
        self._old = old
        self._new: list[torch.Tensor] = []
        self.lens = lens  # Each row's valid length at the current sample rate.

    def _padded(self, x: torch.Tensor, width: int) -> torch.Tensor:
        """``x`` with each row's history (zeros for a new row) before it: ``(B, C, width + T)``."""
        index = len(self._new)
        batch, channels = x.shape[0], x.shape[1]
        if width == 0 or all(row is None for row in self._old):
            history = x.new_zeros(batch, channels, width)
        elif all(row is not None for row in self._old):
            history = torch.stack([row[index] for row in self._old])  # type: ignore[index]
        else:
            blank = x.new_zeros(channels, width)
            history = torch.stack([blank if row is None else row[index] for row in self._old])
        padded = torch.cat([history, x], dim=-1)
        # The row's last `width` valid samples, history included: positions lens .. lens + width of `padded`.
        positions = self.lens[:, None] + torch.arange(width, device=x.device)
        self._new.append(torch.gather(padded, 2, positions[:, None, :].expand(batch, channels, width)))
        return padded

    def conv(self, module: Any, x: torch.Tensor) -> torch.Tensor:
        """A ``CausalConv1dNorm`` (stride 1): its left zero padding replaced by the history."""
        conv = module.conv
        width = (conv.kernel_size[0] - 1) * conv.dilation[0]
        return module.activation(conv(self._padded(x, width)))

    def conv_transpose(self, module: Any, x: torch.Tensor) -> torch.Tensor:
        """A ``CausalConvTranspose1dNorm``: the history's outputs and the right overhang are cut."""
        conv = module.conv
        stride, kernel = conv.stride[0], conv.kernel_size[0]
        width = -(-(kernel - stride) // stride)
        out = conv(self._padded(x, width))[..., width * stride : (width + x.shape[-1]) * stride]
        self.lens = self.lens * stride
        return module.activation(out)

    def row_buffers(self) -> list[list[torch.Tensor]]:
        """Each row's new history, one tensor per convolution."""
        per_layer = [layer.unbind(0) for layer in self._new]
        return [list(row) for row in zip(*per_layer, strict=True)]


class CodecDecoding:
    """The engine's codec (worker thread only): whole decodes, batched chunk decodes, a decoder per request."""

    def __init__(self, model: Any, *, stateful: bool, context_frames: int | None, name: str) -> None:
        """Choose how chunks are decoded, measuring the codec's receptive field when that is needed.

        Args:
            model: A loaded ``MagpieTTSModel``.
            stateful: Keep each request's :class:`CodecState` (when the codec is supported; else a warning and
                the context re-decode).
            context_frames: Frames of left context re-decoded with each chunk without a state; None measures
                the receptive field (:func:`~pipecat_nemotron.tts.magpie.streaming.measure_decoder_context`).
            name: The engine, for log lines.

        """
        self._model = model
        self.samples_per_frame = int(model.codec_model_samples_per_frame)
        self.streaming: StreamingCodec | None = None
        if stateful:
            try:
                self.streaming = StreamingCodec(model)
            except ValueError as e:  # Its message names what the codec has that the stateful decode lacks.
                logger.warning(
                    f"{name}: {e}; each audio chunk re-decodes the codec's receptive field of left context instead"
                )
        if self.streaming is not None:
            context_frames = 0
        elif context_frames is None:
            context_frames = self._probe(name)
        self.context_frames = context_frames

    def _probe(self, name: str) -> int | None:
        from pipecat_nemotron.tts.magpie.streaming import measure_decoder_context

        model = self._model
        probe = measure_decoder_context(
            self.decode,
            num_codebooks=model.num_audio_codebooks,
            codebook_size=model.codebook_size,
            samples_per_frame=self.samples_per_frame,
            device=next(model.parameters()).device,
        )
        if not probe.causal:
            logger.warning(
                f"{name}: the codec decoder is not causal; streamed audio differs slightly from an offline "
                "decode at chunk boundaries"
            )
        if probe.context_frames is None:
            logger.warning(
                f"{name}: could not bound the codec decoder's receptive field; each audio chunk decodes the "
                "whole prefix (exact, but slower on long sentences). Set decode_context_frames to bound it."
            )
        return probe.context_frames

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """NeMo's whole decode of codes ``(num_codebooks, T)``: float audio ``(T * samples_per_frame,)``."""
        from pipecat_nemotron.tts.magpie._nemo_private import codes_to_audio

        return codes_to_audio(self._model, codes)

    def decode_batch(
        self, codes: torch.Tensor, lens: torch.Tensor, states: Sequence[CodecState | None]
    ) -> list[torch.Tensor]:
        """Decode right-padded rows ``(B, num_codebooks, T)`` of ``lens`` frames, each after its state (if any)."""
        from pipecat_nemotron.tts.magpie._nemo_private import codes_to_audio_batch

        if any(state is not None for state in states):
            if self.streaming is None or any(state is None for state in states):
                raise ValueError("codec states given for only some rows, or without a streaming codec")
            return self.streaming.decode(codes, lens, states)  # type: ignore[arg-type]
        return codes_to_audio_batch(self._model, codes, lens)

    def new_decoder(self, options: MagpieSynthesisOptions) -> StreamingDecoder:
        """A streaming decoder for one request (with its own codec state when decoding statefully)."""
        from pipecat_nemotron.tts.magpie.streaming import StreamingDecoder

        return StreamingDecoder(
            self.decode_batch,
            samples_per_frame=self.samples_per_frame,
            context_frames=self.context_frames,
            first_chunk_frames=options.first_chunk_frames,
            chunk_frames=options.chunk_frames,
            max_chunk_frames=options.max_chunk_frames,
            state=CodecState() if self.streaming is not None else None,
        )
