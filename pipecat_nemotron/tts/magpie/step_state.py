"""The state of the fast Magpie step: rows (sequences), their sampling, the slot KV cache, code picking.

See :mod:`pipecat_nemotron.tts.magpie.fast_step` for the step itself and the semantics it keeps.
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
    if lt_type == "autoregressive":  # Run one position at a time: every feed-forward must be position-wise.
        from pipecat_nemotron.tts.magpie._nemo_private import local_transformer_helper

        for layer in local_transformer_helper(model).local_transformer.layers:
            conv = getattr(getattr(getattr(layer, "pos_ff", None), "proj", None), "conv", None)
            if conv is None or conv.kernel_size[0] != 1 or getattr(layer, "use_moe", False):
                return "a local-transformer feed-forward that is not position-wise (kernel > 1 or MoE)"
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
    pending: tuple[torch.Tensor, list[torch.Tensor]] | None = (
        None  # Prefill outputs and scores, not sampled yet.
    )
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

    def save_prefix(self, slot: int, length: int) -> list[dict[str, torch.Tensor]]:
        """Copies of one slot's first ``length`` self-attention positions and its first text position, per layer."""
        return [
            {
                "k": c["k"][slot, :, :length].clone(),
                "v": c["v"][slot, :, :length].clone(),
                "xk": c["xk"][slot, :, :1].clone(),
                "xv": c["xv"][slot, :, :1].clone(),
            }
            for c in self.layers
        ]

    def restore_prefix(self, slot: int, saved: list[dict[str, torch.Tensor]]) -> None:
        """Write :meth:`save_prefix` copies into ``slot`` (the rest of its text positions zeroed)."""
        for cache, layer in zip(self.layers, saved, strict=True):
            length = layer["k"].shape[1]
            cache["k"][slot, :, :length] = layer["k"]
            cache["v"][slot, :, :length] = layer["v"]
            cache["xk"][slot] = 0.0
            cache["xv"][slot] = 0.0
            cache["xk"][slot, :, :1] = layer["xk"]
            cache["xv"][slot, :, :1] = layer["xv"]

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


class RowsPicker:
    """Chooses one code per codebook for every row of a step, batched, as NeMo's samplers do.

    NeMo's rules: forbid special tokens but EOS; forbid EOS early (``min_generated_frames``) and for unfinished
    text, force it for finished text; keep the top-k logits; sample at the temperature. Sampling draws, per row
    and frame, one uniform number per codebook from the row's own generator and inverts the row's cumulative
    distribution, so a row's codes depend on its logits and its generator only (never on its batch).
    """

    def __init__(self, model: Any, rows: list[Row], flags: list[tuple[bool, bool, bool]], draw: bool) -> None:
        """Prepare the per-row masks, top-k, temperatures and (if ``draw``) this frame's uniform numbers.

        Args:
            model: The model (token ids and sizes).
            rows: The step's rows.
            flags: Per row: forbid EOS (too early), forbid EOS (text unfinished), force EOS (text finished).
            draw: Draw the rows' random numbers (False when no row samples this step: teacher forcing).

        """
        from nemo.collections.tts.modules.magpietts_modules import SpecialAudioToken

        self.tokens = int(model.num_all_tokens_per_codebook)
        self.eos = int(model.audio_eos_id)
        device = next(model.parameters()).device
        self.forbidden = torch.tensor(
            SpecialAudioToken.get_forbidden_tokens(model.codebook_size, forbid_audio_eos=False), device=device
        )
        flag = torch.tensor(flags, dtype=torch.bool, device=device).reshape(len(rows), 3)
        self.no_eos, self.force_eos = flag[:, 0], flag[:, 2]
        self.unfinished = flag[:, 1]
        self.any_flag = bool(flag.any())
        self.topk = torch.tensor([min(r.sampling.topk, self.tokens) for r in rows], device=device)
        self.kmax = int(self.topk.max()) if rows else 1
        temps = [r.sampling.temperature for r in rows]
        self.greedy = torch.tensor([t <= 0 or r.sampling.topk == 1 for t, r in zip(temps, rows, strict=True)])
        self.temperature = torch.tensor([t if t > 0 else 1.0 for t in temps], device=device)[:, None]
        codebooks = int(model.num_audio_codebooks)
        self.uniform = None
        if draw and not bool(self.greedy.all()):
            self.uniform = torch.stack([_uniform(codebooks, r.sampling.generator).to(device) for r in rows])

    def mask(self, view: torch.Tensor) -> torch.Tensor:
        """Apply the token rules to ``view (rows, codebooks, tokens)`` in place; return it."""
        view[:, :, self.forbidden] = float("-inf")
        if self.any_flag:
            eos = view[:, :, self.eos]
            eos.masked_fill_(self.unfinished[:, None], float("-inf"))
            view.masked_fill_(self.force_eos[:, None, None], float("-inf"))
            eos = eos.masked_fill(self.force_eos[:, None], 0.0)
            view[:, :, self.eos] = eos.masked_fill(self.no_eos[:, None], float("-inf"))
        return view

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """Codes ``(rows, codebooks)`` of the most likely allowed tokens (NeMo's EOS check)."""
        view = self.mask(logits.view(logits.shape[0], -1, self.tokens))
        return view.argmax(dim=-1)

    def sample(self, logits: torch.Tensor, codebook: int) -> torch.Tensor:
        """Codes ``(rows,)`` for one codebook from ``logits (rows, tokens)`` (modified in place)."""
        view = self.mask(logits.view(logits.shape[0], 1, self.tokens))[:, 0]
        values = torch.topk(view, self.kmax, dim=-1)[0]
        threshold = values.gather(1, (self.topk - 1)[:, None])
        view = view.masked_fill(view < threshold, float("-inf"))
        picks = view.argmax(dim=-1)
        if self.uniform is None:
            return picks
        probs = torch.softmax(view / self.temperature, dim=-1)
        cdf = probs.cumsum(dim=-1)
        target = self.uniform[:, codebook : codebook + 1] * cdf[:, -1:]
        sampled = (cdf < target).sum(dim=-1).clamp_(max=self.tokens - 1)
        return torch.where(self.greedy.to(picks.device), picks, sampled)


def _uniform(count: int, generator: torch.Generator | None) -> torch.Tensor:
    """``count`` uniform numbers in [0, 1) from ``generator`` (on its own device), or torch's global one."""
    if generator is None:
        return torch.rand(count)
    return torch.rand(count, generator=generator, device=generator.device)
