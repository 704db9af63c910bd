"""Model configurations of the Nemotron Speech streaming family, buildable without any download.

These configs describe the architecture of ``nvidia/nemotron-speech-streaming-en-0.6b`` (FastConformer
encoder, 8x ``dw_striding`` subsampling, ``chunked_limited`` multi-lookahead attention, causal convolutions,
RNNT head) at any size; two are named:

* :data:`NEMOTRON_600M` — the real 24-layer, d_model 1024 architecture (random weights), used by benchmarks
  when the checkpoint is not available.
* :data:`TINY` — a 4-layer, d_model 128 model of the same family, used by tests (the bundled trained tiny
  model, built by ``scripts/make_tiny_model.py``, has this shape too).

:func:`asr_model_config` writes the NeMo config of a size; :func:`build_random_model` instantiates it with a
freshly trained SentencePiece tokenizer and writes a ``.nemo`` file that the engine then loads through exactly
the same code path as a real checkpoint. Nothing here is imported by ``import pipecat_nemotron`` or
``import pipecat_nemotron.asr``.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE
from pipecat_nemotron.runtime.nemo_logs import quiet_nemo

#: The attention contexts the real checkpoint was trained with, in 80 ms encoder frames.
NEMOTRON_ATT_CONTEXT_SIZES: list[list[int]] = [[70, 13], [70, 6], [70, 1], [70, 0]]

#: The attention contexts of the multilingual ``nvidia/nemotron-3.5-asr-streaming-0.6b`` family: the English
#: model's four plus the 320 ms mode, which has a shorter left context ([56, 3]).
MULTILINGUAL_ATT_CONTEXT_SIZES: list[list[int]] = [[70, 13], [70, 6], [56, 3], [70, 1], [70, 0]]

#: Language prompt key of the language-agnostic ("detect it yourself") prompt of a multilingual model.
AUTO_LANGUAGE = "auto"

_TOKENIZER_TEXT = (
    "zero one two three four five six seven eight nine ten hello hi yes no please thanks stop cancel "
    "what time is it what is the weather today tomorrow monday tuesday wednesday thursday friday saturday "
    "sunday set a timer for minutes plus minus times good morning evening call play music open close"
)


@dataclass(frozen=True)
class FastConformerSize:
    """Layer sizes of a cache-aware FastConformer-RNNT of the Nemotron streaming family.

    Attributes:
        features: Mel bins of the preprocessor (the encoder's input width).
        n_layers: Conformer layers.
        d_model: Encoder width.
        n_heads: Attention heads.
        conv_kernel: Causal depthwise convolution kernel, encoder frames.
        sub_channels: Channels of the ``dw_striding`` subsampling convolutions.
        pred_hidden: RNNT prediction network width.
        joint_hidden: RNNT joint network width.

    """

    features: int
    n_layers: int
    d_model: int
    n_heads: int
    conv_kernel: int
    sub_channels: int
    pred_hidden: int
    joint_hidden: int


#: ~2M parameters: the tests' random models and the bundled tiny model.
TINY = FastConformerSize(
    features=80,
    n_layers=4,
    d_model=128,
    n_heads=4,
    conv_kernel=9,
    sub_channels=64,
    pred_hidden=128,
    joint_hidden=128,
)

#: ~614M parameters: the architecture of ``nvidia/nemotron-speech-streaming-en-0.6b``.
NEMOTRON_600M = FastConformerSize(
    features=128,
    n_layers=24,
    d_model=1024,
    n_heads=8,
    conv_kernel=9,
    sub_channels=256,
    pred_hidden=640,
    joint_hidden=640,
)

#: The sizes :func:`build_random_model` knows by name.
SIZES: dict[str, FastConformerSize] = {"tiny": TINY, "600m": NEMOTRON_600M}


def _preprocessor_cfg(size: FastConformerSize, dither: float) -> dict[str, Any]:
    return {
        "_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor",
        "sample_rate": MODEL_SAMPLE_RATE,
        "normalize": "NA",
        "window_size": 0.025,
        "window_stride": 0.01,
        "window": "hann",
        "features": size.features,
        "n_fft": 512,
        "log": True,
        "frame_splicing": 1,
        "dither": dither,
        "pad_to": 0,
        "pad_value": 0.0,
    }


def _encoder_cfg(
    size: FastConformerSize, att_context_sizes: list[list[int]], dropout: float
) -> dict[str, Any]:
    return {
        "_target_": "nemo.collections.asr.modules.ConformerEncoder",
        "feat_in": size.features,
        "feat_out": -1,
        "n_layers": size.n_layers,
        "d_model": size.d_model,
        "subsampling": "dw_striding",
        "subsampling_factor": 8,
        "subsampling_conv_channels": size.sub_channels,
        "causal_downsampling": True,
        "ff_expansion_factor": 4,
        "self_attention_model": "rel_pos",
        "n_heads": size.n_heads,
        "att_context_size": [list(c) for c in att_context_sizes],
        "att_context_probs": [1.0 / len(att_context_sizes)] * len(att_context_sizes),
        "att_context_style": "chunked_limited",
        "xscaling": True,
        "untie_biases": True,
        "pos_emb_max_len": 5000,
        "conv_kernel_size": size.conv_kernel,
        "conv_norm_type": "layer_norm",
        "conv_context_size": "causal",
        "dropout": dropout,
        "dropout_pre_encoder": dropout,
        "dropout_emb": 0.0,
        "dropout_att": dropout,
    }


def asr_model_config(
    tokenizer_dir: str,
    size: FastConformerSize = TINY,
    *,
    att_context_sizes: list[list[int]] = NEMOTRON_ATT_CONTEXT_SIZES,
    dropout: float = 0.0,
    dither: float = 0.0,
) -> dict[str, Any]:
    """Return the NeMo config of an ``EncDecRNNTBPEModel`` of the Nemotron streaming family.

    The defaults give an inference model (no dropout, no dither). A training script sets ``dropout`` and
    ``dither`` and adds its own keys (datasets, ``spec_augment``, ``aux_ctc``, ``optim`` settings) to the dict.

    Args:
        tokenizer_dir: Folder holding a SentencePiece ``tokenizer.model`` (and ``vocab.txt``).
        size: Layer sizes (:data:`TINY`, :data:`NEMOTRON_600M` or your own).
        att_context_sizes: ``[left, right]`` attention contexts trained jointly, encoder frames (80 ms); the
            first is the model's default. Each is equally likely in training.
        dropout: Dropout of the encoder (all but the embedding), prediction and joint networks.
        dither: Preprocessor dither (NeMo trains with ``1e-5``).

    """
    return {
        "sample_rate": MODEL_SAMPLE_RATE,
        "tokenizer": {"dir": tokenizer_dir, "type": "bpe"},
        "model_defaults": {
            "enc_hidden": size.d_model,
            "pred_hidden": size.pred_hidden,
            "joint_hidden": size.joint_hidden,
        },
        "preprocessor": _preprocessor_cfg(size, dither),
        "encoder": _encoder_cfg(size, att_context_sizes, dropout),
        "decoder": {
            "_target_": "nemo.collections.asr.modules.RNNTDecoder",
            "normalization_mode": None,
            "random_state_sampling": False,
            "blank_as_pad": True,
            "prednet": {
                "pred_hidden": size.pred_hidden,
                "pred_rnn_layers": 1,
                "t_max": None,
                "dropout": dropout,
            },
        },
        "joint": {
            "_target_": "nemo.collections.asr.modules.RNNTJoint",
            "log_softmax": None,
            "preserve_memory": False,
            "fuse_loss_wer": False,
            "jointnet": {
                "joint_hidden": size.joint_hidden,
                "activation": "relu",
                "dropout": dropout,
                "encoder_hidden": size.d_model,
                "pred_hidden": size.pred_hidden,
            },
        },
        "decoding": {"strategy": "greedy_batch", "greedy": {"max_symbols": 10}},
        "loss": {"loss_name": "pytorch"},
        "optim": {"name": "adamw", "lr": 1e-3},
    }


def prompt_model_defaults(languages: list[str], num_prompts: int = 128) -> dict[str, Any]:
    """The ``model_defaults`` keys that make a config one of the prompt class (a language one-hot per stream).

    Args:
        languages: Locale codes (``"en-US"``, ``"es-ES"``), given one-hot indices 0, 1, ... in this order;
            :data:`AUTO_LANGUAGE` gets the next index.
        num_prompts: Width of the one-hot (the real model reserves 128).

    Returns:
        ``num_prompts``, ``prompt_dictionary`` and ``initialize_prompt_feature`` for ``cfg["model_defaults"]``.

    """
    if len(languages) + 1 > num_prompts:
        raise ValueError(f"{len(languages)} languages and auto need num_prompts > {len(languages)}")
    dictionary = {lang: i for i, lang in enumerate(languages)}
    dictionary[AUTO_LANGUAGE] = len(languages)
    return {"num_prompts": num_prompts, "prompt_dictionary": dictionary, "initialize_prompt_feature": True}


def nemotron_600m_config(tokenizer_dir: str) -> dict[str, Any]:
    """:func:`asr_model_config` of :data:`NEMOTRON_600M` (24 layers, d_model 1024, ~614M parameters)."""
    return asr_model_config(tokenizer_dir, NEMOTRON_600M)


def train_tokenizer(
    out_dir: Path, vocab_size: int = 64, text: str = _TOKENIZER_TEXT, user_pieces: Sequence[str] = ()
) -> Path:
    """Train a SentencePiece BPE tokenizer in the layout NeMo's ``tokenizer.dir`` expects.

    Args:
        out_dir: Folder to write ``tokenizer.model``, ``tokenizer.vocab`` and ``vocab.txt`` into.
        vocab_size: Number of pieces (``user_pieces`` included).
        text: Training text; repeated and shuffled so SentencePiece sees enough sentences.
        user_pieces: Pieces kept whole (SentencePiece's ``user_defined_symbols``), such as the ``<EOU>``
            marker of NVIDIA's realtime EOU models (:mod:`~pipecat_nemotron.asr.eou`). Their recipe appends
            them after the BPE pieces; SentencePiece puts them right after ``<unk>``: the engine finds them by
            piece, wherever they sit.

    Returns:
        ``out_dir``.

    """
    import sentencepiece as spm

    out_dir.mkdir(parents=True, exist_ok=True)
    words = text.split()
    rng = random.Random(0)
    corpus = out_dir / "corpus.txt"
    with corpus.open("w") as f:
        for _ in range(2000):
            f.write(" ".join(rng.choice(words) for _ in range(rng.randint(3, 10))) + "\n")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(out_dir / "tokenizer"),
        vocab_size=vocab_size,
        model_type="bpe",
        character_coverage=1.0,
        bos_id=-1,
        eos_id=-1,
        minloglevel=2,
        **({"user_defined_symbols": list(user_pieces)} if user_pieces else {}),
    )
    with (out_dir / "tokenizer.vocab").open() as f, (out_dir / "vocab.txt").open("w") as out:
        for line in f:
            piece = line.split("\t")[0]
            out.write(piece + "\n")
    return out_dir


def build_random_model(
    out_path: str | Path,
    size: str = "tiny",
    seed: int = 0,
    vocab_size: int = 64,
    blank_bias: float = 0.0,
    languages: list[str] | None = None,
    markers: Sequence[str] = (),
    marker_bias: float = 0.0,
) -> Path:
    """Build a randomly initialised cache-aware FastConformer-RNNT and save it as a ``.nemo`` file.

    Args:
        out_path: Destination ``.nemo`` path.
        size: A name in :data:`SIZES`: ``"tiny"`` (tests) or ``"600m"`` (the real architecture, for benchmarks).
        seed: Seed for the weights, so tests are reproducible.
        vocab_size: Tokenizer size.
        blank_bias: Added to the joint's blank logit. Random joints emit many symbols per frame (a worst
            case for the decoder); a positive bias makes decoding look like a trained model's.
        languages: Build the multilingual prompt class (``EncDecRNNTBPEModelWithPrompt``) with these locales
            (see :func:`prompt_model_defaults`) and the five attention contexts of
            :data:`MULTILINGUAL_ATT_CONTEXT_SIZES`; None builds the English class.
        markers: Marker pieces added to the tokenizer (``("<EOU>",)`` or ``("<EOU>", "<EOB>")``: a model of
            the realtime EOU kind, see :mod:`~pipecat_nemotron.asr.eou`).
        marker_bias: Added to the joint's logits of the ``markers``, so a random model emits them.

    Returns:
        The written path.

    """
    import torch
    from omegaconf import OmegaConf

    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, quiet_nemo():
        from nemo.collections.asr.models import EncDecRNNTBPEModel, EncDecRNNTBPEModelWithPrompt

        tok_dir = train_tokenizer(Path(tmp) / "tokenizer", vocab_size=vocab_size, user_pieces=markers)
        torch.manual_seed(seed)
        if languages is None:
            cfg = OmegaConf.create(asr_model_config(str(tok_dir), SIZES[size]))
            model = EncDecRNNTBPEModel(cfg=cfg)
        else:
            config = asr_model_config(
                str(tok_dir), SIZES[size], att_context_sizes=MULTILINGUAL_ATT_CONTEXT_SIZES
            )
            config["model_defaults"].update(prompt_model_defaults(languages))
            model = EncDecRNNTBPEModelWithPrompt(cfg=OmegaConf.create(config))
        with torch.no_grad():
            bias = model.joint.joint_net[-1].bias  # one logit per token id, blank last
            if blank_bias:
                bias[-1] += blank_bias
            if marker_bias:
                pieces = model.tokenizer.ids_to_tokens(list(range(model.tokenizer.vocab_size)))
                for piece in markers:
                    bias[pieces.index(piece)] += marker_bias
        model.eval()
        model.save_to(str(out_path))
    return out_path
