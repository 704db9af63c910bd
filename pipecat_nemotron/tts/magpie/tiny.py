"""A tiny, randomly initialised Magpie TTS model for tests and offline demos.

NeMo ships no example configs in its wheel, so the configs below are rebuilt from the constructors of
``AudioCodecModel`` and ``MagpieTTSModel`` (nemo-toolkit 3.0). The result has the shape of the real
``nvidia/magpie_tts_multilingual_357m`` — a ``decoder_ce`` model with five baked speakers and an autoregressive
local transformer over a causal 22,050 Hz codec with 1,024 samples per frame and 8 codebooks of 2,016 codes — but
is ~1.7M parameters and says nothing intelligible. Nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipecat_nemotron.runtime.nemo_logs import quiet_nemo
from pipecat_nemotron.tts.magpie._nemo_private import set_baked_speakers

TINY_SAMPLE_RATE = 22050
"""Codec sample rate of the tiny model, in Hz (the real codec's rate)."""

TINY_SAMPLES_PER_FRAME = 1024
"""Audio samples per codec frame (about 46 ms at 22,050 Hz)."""

TINY_NUM_SPEAKERS = 5
"""Baked speakers, matching john/sofia/aria/jason/leo of the real model."""

_FSQ_LEVELS = [8, 7, 6, 6]  # 8 * 7 * 6 * 6 = 2,016 codes per codebook, as in the real codec.
_NUM_CODEBOOKS = 8


@dataclass(frozen=True)
class MagpieShape:
    """Sizes of a random ``decoder_ce`` Magpie (the codec is always the tiny one).

    Attributes:
        width: ``d_model`` of the encoder and decoder.
        encoder_layers: Text encoder layers (non-causal, kernel 3 in the released model).
        decoder_layers: Decoder layers (causal, kernel 1, cross-attention to the text).
        heads: Self-attention heads.
        xa_head_dim: Cross-attention head size (one head), None: ``width``.
        decoder_pos_emb: Whether the decoder adds learnable position embeddings.
        lt_width: Local transformer width.
        baked_context_frames: Frames of each baked speaker context.
        max_len: Causal-mask length (bounds context + frames).
        decoder_kernel: Decoder feed-forward kernel, in frames (1 in the released model; wider is not supported by
            the fast step, so a tiny model with 3 exercises the fallback to NeMo's step).

    """

    width: int
    encoder_layers: int
    decoder_layers: int
    heads: int
    xa_head_dim: int | None
    decoder_pos_emb: bool
    lt_width: int
    baked_context_frames: int
    max_len: int
    decoder_kernel: int = 1


TINY_SHAPE = MagpieShape(32, 1, 2, 2, None, True, 32, 10, 512)
"""The tiny test model (~1.7M parameters)."""

RELEASED_SHAPE = MagpieShape(768, 6, 12, 12, 128, False, 256, 110, 2048)
"""The shape of ``nvidia/magpie_tts_multilingual_357m`` (its text vocabulary and codec differ: random weights)."""

SMALL_RELEASED_FAMILY_SHAPE = MagpieShape(64, 2, 3, 4, 16, False, 32, 12, 512)
"""A small model of the released shape family (no decoder position embeddings, a narrow cross-attention head)."""


def codec_config() -> dict[str, Any]:
    """The tiny codec's config (what :func:`build_tiny_codec` builds; the trained codec widens it)."""
    encoded_dim = _NUM_CODEBOOKS * len(_FSQ_LEVELS)
    return {
        "sample_rate": TINY_SAMPLE_RATE,
        "samples_per_frame": TINY_SAMPLES_PER_FRAME,
        "commit_loss_scale": 0.0,
        "audio_encoder": {
            "_target_": "nemo.collections.tts.modules.audio_codec_modules.CausalHiFiGANEncoder",
            "encoded_dim": encoded_dim,
            "down_sample_rates": [4, 4, 8, 8],
            "base_channels": 4,
            "resblock_kernel_sizes": [3],
            "resblock_dilation_sizes": [1],
        },
        "vector_quantizer": {
            "_target_": "nemo.collections.tts.modules.audio_codec_modules.GroupFiniteScalarQuantizer",
            "num_groups": _NUM_CODEBOOKS,
            "num_levels_per_group": _FSQ_LEVELS,
        },
        "audio_decoder": {
            "_target_": "nemo.collections.tts.modules.audio_codec_modules.CausalHiFiGANDecoder",
            "input_dim": encoded_dim,
            "up_sample_rates": [8, 8, 4, 4],
            "base_channels": 64,
            "resblock_kernel_sizes": [3, 7],
            "resblock_dilation_sizes": [1, 3],
        },
        "loss_resolutions": [[512, 128, 512]],
        "mel_loss_dims": [32],
        "generator_loss": {"_target_": "nemo.collections.tts.losses.audio_codec_loss.GeneratorSquaredLoss"},
        "discriminator_loss": {
            "_target_": "nemo.collections.tts.losses.audio_codec_loss.DiscriminatorSquaredLoss"
        },
    }


def _transformer(
    n_layers: int,
    *,
    causal: bool,
    xattn: bool,
    kernel_size: int,
    max_len: int,
    shape: MagpieShape = TINY_SHAPE,
    pos_emb: bool = True,
) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "n_layers": n_layers,
        "d_model": shape.width,
        "d_ffn": shape.width * 4,
        "sa_n_heads": shape.heads,
        "kernel_size": kernel_size,
        "p_dropout": 0.0,
        "p_dropout_out": 0.0,
        "has_xattn": xattn,
        "is_causal": causal,
        "apply_norm_out": True,
        "max_length_causal_mask": max_len,
        "use_learnable_pos_emb": pos_emb,
    }
    if xattn:
        cfg.update({"xa_d_memory": shape.width, "xa_n_heads": 1, "apply_norm_to_cond": True})
        if shape.xa_head_dim is not None:
            cfg["xa_d_head"] = shape.xa_head_dim
    return cfg


def magpie_config(codec_path: str, shape: MagpieShape = TINY_SHAPE) -> dict[str, Any]:
    """The config of a ``decoder_ce`` Magpie of ``shape`` over the codec at ``codec_path``."""
    tiny = shape == TINY_SHAPE
    return {
        "model_type": "decoder_ce",
        "codecmodel_path": codec_path,
        "embedding_dim": shape.width,
        "use_text_conditioning_encoder": False,
        "context_duration_min": 1.0,
        "context_duration_max": 1.0,
        "prior_scaling_factor": 0.5,
        "prior_end_step": 0,
        "prior_scaledown_start_step": 0,
        "alignment_loss_scale": 0.0,
        "cfg_unconditional_prob": 0.0,
        "local_transformer_type": "autoregressive",
        "local_transformer_n_layers": 1,
        "local_transformer_n_heads": 1,
        "local_transformer_hidden_dim": shape.lt_width,
        "text_tokenizers": {
            "english": {
                "_target_": "nemo.collections.common.tokenizers.text_to_speech.tts_tokenizers.EnglishCharsTokenizer",
                "punct": True,
                "apostrophe": True,
                "pad_with_space": False,
            }
        },
        # Small causal-mask lengths keep the .nemo small: the mask buffers are saved with the weights.
        "encoder": _transformer(
            shape.encoder_layers, causal=tiny, xattn=False, kernel_size=3, max_len=256, shape=shape
        ),
        "context_encoder": _transformer(
            1, causal=False, xattn=False, kernel_size=3, max_len=256, shape=shape
        ),
        "decoder": _transformer(
            shape.decoder_layers,
            causal=True,
            xattn=True,
            kernel_size=shape.decoder_kernel,
            max_len=shape.max_len,
            shape=shape,
            pos_emb=shape.decoder_pos_emb,
        ),
        "optim": {"_target_": "torch.optim.AdamW", "lr": 1e-4},
    }


def set_end_of_speech_bias(model: Any, bias: float) -> None:
    """Set the logit bias of the end-of-speech token in every codebook head of a loaded model.

    Random weights end speech at random moments; a large negative bias makes a model that never ends (generation is
    then bounded by ``MagpieSynthesisOptions.max_duration_s``), a large positive one ends speech at the first frame
    NeMo allows (``min_generated_frames``, 4 by default).

    Args:
        model: A ``MagpieTTSModel`` with an autoregressive local transformer.
        bias: Logit bias, in nats (before the sampling temperature).

    """
    import torch

    tokens = model.num_all_tokens_per_codebook
    eos = model.audio_eos_id
    with torch.no_grad():
        for codebook in range(model.num_audio_codebooks * model.frame_stacking_factor):
            model.final_proj.bias[codebook * tokens + eos] = bias
        for projection in model.local_transformer_out_projections:
            projection.bias[eos] = bias


def random_magpie(
    codec_path: str | Path,
    *,
    seed: int | None = 0,
    end_of_speech_bias: float = -30.0,
    shape: MagpieShape = TINY_SHAPE,
) -> Any:
    """A random ``MagpieTTSModel`` of ``shape`` in memory (eval mode, CPU), on the codec saved at ``codec_path``.

    What :func:`build_tiny_magpie` saves, without the save and reload (seconds instead of a minute for the 357M
    shape, whose ``.nemo`` is a gigabyte).

    Args:
        codec_path: A codec ``.nemo`` (:func:`build_tiny_codec`).
        seed: Torch seed for the random weights (None: continue torch's global generator).
        end_of_speech_bias: See :func:`set_end_of_speech_bias`.
        shape: The model's sizes.

    """
    import torch
    from omegaconf import OmegaConf

    with quiet_nemo(logging.WARNING):
        from nemo.collections.tts.models import MagpieTTSModel

        if seed is not None:
            torch.manual_seed(seed)
        model = MagpieTTSModel(cfg=OmegaConf.create(magpie_config(str(codec_path), shape)))
        # Baked speaker contexts stand in for the context encoder, as in the released checkpoint.
        set_baked_speakers(model, torch.randn(TINY_NUM_SPEAKERS, shape.baked_context_frames, shape.width))
        set_end_of_speech_bias(model, end_of_speech_bias)
    return model.eval()


def build_tiny_codec(out_dir: str | Path, *, seed: int = 0) -> Path:
    """Build and save the tiny random codec; return the path of ``tiny_codec.nemo`` in ``out_dir``."""
    import torch
    from omegaconf import OmegaConf

    with quiet_nemo(logging.WARNING):
        from nemo.collections.tts.models import AudioCodecModel

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        codec_path = out / "tiny_codec.nemo"
        torch.manual_seed(seed)
        AudioCodecModel(cfg=OmegaConf.create(codec_config())).save_to(str(codec_path))
    return codec_path


def build_tiny_magpie(
    out_dir: str | Path,
    *,
    seed: int = 0,
    end_of_speech_bias: float = -30.0,
    shape: MagpieShape = TINY_SHAPE,
) -> tuple[Path, Path]:
    """Build, save and return a tiny random Magpie TTS model and its codec.

    Args:
        out_dir: Directory to write ``tiny_codec.nemo`` and ``tiny_magpie.nemo`` into (created if missing).
        seed: Torch seed for the random weights.
        end_of_speech_bias: See :func:`set_end_of_speech_bias`; the default makes a model that never ends speech on
            its own, so runs are bounded by ``max_duration_s`` and reproducible in length.
        shape: The model's sizes (default: the tiny one; :data:`RELEASED_SHAPE` builds the released 357M shape).

    Returns:
        ``(magpie_path, codec_path)``. The Magpie ``.nemo`` stores ``codec_path`` as its ``codecmodel_path``;
        pass ``codec_model_path`` when loading it from elsewhere (NeMo does not pack the codec inside).

    """
    codec_path = build_tiny_codec(out_dir, seed=seed)
    magpie_path = Path(out_dir) / "tiny_magpie.nemo"
    # The model's weights continue the codec's random stream (the weights tiny models always had for a seed).
    model = random_magpie(codec_path, seed=None, end_of_speech_bias=end_of_speech_bias, shape=shape)
    with quiet_nemo(logging.WARNING):
        model.save_to(str(magpie_path))
    return magpie_path, codec_path


@contextlib.contextmanager
def inference_parameters(model: Any, **params: Any) -> Iterator[None]:
    """Temporarily set fields of ``model.inference_parameters`` (for comparisons with NeMo's own loop)."""
    old = {k: getattr(model.inference_parameters, k) for k in params}
    for k, v in params.items():
        setattr(model.inference_parameters, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(model.inference_parameters, k, v)


def english_tokens(model: Any, text: str) -> Any:
    """The token ids of ``text`` as one English chunk, as NeMo's ``chunk_text_for_inference`` makes them."""
    from nemo.collections.tts.parts.utils.tts_dataset_utils import (
        chunk_text_for_inference,
        get_tokenizer_for_language,
    )

    name = get_tokenizer_for_language("en", list(model.tokenizer.tokenizers.keys()))
    chunks, lens, _ = chunk_text_for_inference(
        text=text, language="en", tokenizer_name=name, text_tokenizer=model.tokenizer, eos_token_id=model.eos_id
    )
    assert len(chunks) == 1, f"{text!r} is more than one text chunk"
    return chunks[0][: int(lens[0])]
