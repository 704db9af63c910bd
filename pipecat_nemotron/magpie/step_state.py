"""The state of the fast Magpie step: rows (sequences), their sampling, the slot KV cache, code picking.

See :mod:`pipecat_nemotron.magpie.fast_step` for the step itself and the semantics it keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

MIN_CAPACITY = 64  # Initial cache length, in positions (context + frames); doubled when a row outgrows it.


def unsupported_reason(model: Any) -> str | None:
    """Why :class:`FastMagpieStep` cannot run ``model`` (None when it can).

    Args:
        model: A loaded ``MagpieTTSModel``.

    """
    decoder = getattr(model, "decoder", None)
    layers = getattr(decoder, "layers", None)
    if layers is None or type(decoder).__name__ != "Transformer":
        return "the decoder is not NeMo's transformer_2501.Transformer"
    if getattr(model, "model_type", None) not in ("decoder_ce", "decoder_context_tts"):
        return f"model_type {getattr(model, 'model_type', None)!r} (needs decoder_ce or decoder_context_tts)"
    if int(getattr(model, "frame_stacking_factor", 1)) != 1:
        return "frame stacking"
    if getattr(decoder, "use_moe", False):
        return "a mixture-of-experts decoder"
    for layer in layers:
        conv = getattr(getattr(getattr(layer, "pos_ff", None), "proj", None), "conv", None)
        if conv is None or conv.kernel_size[0] != 1:
            return "a decoder feed-forward kernel wider than 1 frame"
        if not layer.has_xattn:
            return "a decoder layer without cross-attention"
    lt_type = str(getattr(getattr(model, "local_transformer_type", None), "value", "none"))
    if lt_type not in ("autoregressive", "none"):
        return f"local transformer type {lt_type!r}"
    return None


@dataclass
class RowSampling:
    """How one row samples its codes.

    Attributes:
        temperature: Softmax temperature (<= 0: argmax).
        topk: Keep this many most likely codes per codebook (1: greedy).
        use_cfg: Classifier-free guidance (a second, unconditional slot).
        generator: The row's own random generator (on the model's device).

    """

    temperature: float
    topk: int
    use_cfg: bool
    generator: torch.Generator | None = None


@dataclass
class Row:
    """One sequence being decoded: one text chunk of one request. Created by :meth:`FastMagpieStep.add_row`.

    Attributes:
        sampling: Sampling settings and generator.
        text_len: Text tokens after NeMo's context preparation.
        step: Decoding steps taken (frames sampled, the end-of-speech frame included).
        ended: The model ended the speech (the last sampled frame was end of speech and is not audio).
        codes: Codes of every kept frame, each ``(num_codebooks,)``.

    """

    sampling: RowSampling
    text_len: int
    prefix_len: int
    max_steps: int
    memory_len: int
    slot: int = -1
    uncond_slot: int = -1
    step: int = 0
    ended: bool = False
    codes: list[torch.Tensor] = field(default_factory=list)
    # NeMo's per-item alignment state (generate_speech's ChunkState/ChunkedDecoderState, one item).
    last_attended: list[list[int]] = field(default_factory=lambda: [[1]])
    counter: list[dict[int, int]] = field(default_factory=lambda: [{}])
    unfinished: dict[int, bool] = field(default_factory=dict)
    finished_counter: dict[int, int] = field(default_factory=dict)
    end_indices: dict[int, int] = field(default_factory=dict)
    prior: torch.Tensor | None = None  # (1 or 2, text_len) for the next step; None before the first.
    pending: tuple[torch.Tensor, torch.Tensor] | None = None  # Prefill output and scores, not sampled yet.
    last_codes: torch.Tensor | None = None  # The frame fed to the decoder at the next step.

    @property
    def position(self) -> int:
        """Cache position of the frame fed to the decoder next (the first sampled frame follows the prefix)."""
        return self.prefix_len + max(0, self.step - 1)

    @property
    def done(self) -> bool:
        """Whether the row will produce no more frames (ended by the model, or at NeMo's ``max_decoder_steps``)."""
        return self.ended or self.step >= self.max_steps


class SlotCache:
    """Per-layer self- and cross-attention keys/values for ``slots`` sequences."""

    def __init__(self, model: Any, slots: int, device: torch.device, dtype: torch.dtype) -> None:
        self.layers = []
        for layer in model.decoder.layers:
            sa, xa = layer.self_attention, layer.cross_attention
            self.layers.append(
                {
                    "k": torch.zeros(slots, sa.n_heads, MIN_CAPACITY, sa.d_head, device=device, dtype=dtype),
                    "v": torch.zeros(slots, sa.n_heads, MIN_CAPACITY, sa.d_head, device=device, dtype=dtype),
                    "xk": torch.zeros(slots, xa.n_heads, 1, xa.d_head, device=device, dtype=dtype),
                    "xv": torch.zeros(slots, xa.n_heads, 1, xa.d_head, device=device, dtype=dtype),
                }
            )
        self.xmask = torch.zeros(slots, 1, dtype=torch.bool, device=device)

    @property
    def capacity(self) -> int:
        """Self-attention positions the cache holds per slot."""
        return self.layers[0]["k"].shape[2]

    def grow(self, length: int, text_len: int) -> None:
        """Make room for ``length`` self-attention positions and ``text_len`` text positions."""
        for cache in self.layers:
            for name, need, dim in (
                ("k", length, 2),
                ("v", length, 2),
                ("xk", text_len, 2),
                ("xv", text_len, 2),
            ):
                have = cache[name].shape[dim]
                if need > have:
                    new = max(need, 2 * have) if name in ("k", "v") else need
                    pad = list(cache[name].shape)
                    pad[dim] = new - have
                    cache[name] = torch.cat([cache[name], cache[name].new_zeros(pad)], dim=dim)
        if text_len > self.xmask.shape[1]:
            self.xmask = torch.cat(
                [self.xmask, self.xmask.new_zeros(self.xmask.shape[0], text_len - self.xmask.shape[1])], 1
            )

    def move(self, src: int, dst: int) -> None:
        """Copy slot ``src`` into slot ``dst`` (compaction when a row leaves)."""
        for cache in self.layers:
            for tensor in cache.values():
                tensor[dst] = tensor[src]
        self.xmask[dst] = self.xmask[src]


@dataclass
class StepOutput:
    """What :meth:`FastMagpieStep.forward` computed for one step.

    Attributes:
        rows: The rows, in the order of ``logits``.
        dec_out: Decoder output per slot ``(slots, d_model)``.
        logits: CFG-combined logits per row ``(rows, num_codebooks * tokens_per_codebook)``.
        scores: Alignment scores per slot ``(slots, text)``.

    """

    rows: list[Row]
    dec_out: torch.Tensor
    logits: torch.Tensor
    scores: torch.Tensor


def eos_method(name: str) -> Any:
    """NeMo's ``EOSDetectionMethod`` named ``name``."""
    from nemo.collections.tts.modules.magpietts_modules import EOSDetectionMethod

    return EOSDetectionMethod(name)


def pick_codes(
    logits: torch.Tensor,
    model: Any,
    flags: list[tuple[bool, bool, bool]],
    rows: list[Row] | None,
    codebooks: int | None = None,
) -> torch.Tensor:
    """Choose one code per codebook and row, as NeMo's samplers do (``rows`` None: argmax, for EOS detection).

    Args:
        logits: ``(rows, codebooks * tokens)``, modified in place.
        model: The model (token ids and sizes).
        flags: Per row: forbid EOS (too early), forbid EOS (text unfinished), force EOS (text finished).
        rows: The rows whose sampling settings and generators to use; None takes the argmax.
        codebooks: Codebooks in ``logits`` (default: all of the model's).

    """
    from nemo.collections.tts.modules.magpietts_modules import SpecialAudioToken

    tokens = model.num_all_tokens_per_codebook
    count = codebooks or model.num_audio_codebooks
    view = logits.view(logits.shape[0], count, tokens)
    eos = model.audio_eos_id
    forbidden = SpecialAudioToken.get_forbidden_tokens(model.codebook_size, forbid_audio_eos=False)
    view[:, :, forbidden] = float("-inf")
    for i, (early, unfinished, finished) in enumerate(flags):
        if unfinished:
            view[i, :, eos] = float("-inf")
        if finished:
            view[i] = float("-inf")
            view[i, :, eos] = 0.0
        if early:
            view[i, :, eos] = float("-inf")
    if rows is None:
        return view.argmax(dim=-1)
    picks = []
    for i, row in enumerate(rows):
        s = row.sampling
        row_logits = view[i]
        top = torch.topk(row_logits, min(s.topk, tokens), dim=-1)[0][:, -1:]
        row_logits = row_logits.masked_fill(row_logits < top, float("-inf"))
        if s.temperature <= 0 or s.topk == 1:
            picks.append(row_logits.argmax(dim=-1))
            continue
        probs = torch.softmax(row_logits / s.temperature, dim=-1)
        picks.append(torch.multinomial(probs, 1, generator=s.generator)[:, 0])
    return torch.stack(picks)
