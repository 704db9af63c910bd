#!/usr/bin/env python
"""Build the tiny bilingual (English + Spanish) cache-aware streaming ASR model of NeMo's prompt class.

The tiny counterpart of ``nvidia/nemotron-3.5-asr-streaming-0.6b``: an ``EncDecHybridRNNTCTCBPEModelWithPrompt``
whose encoder output is concatenated with a language one-hot (``en-US``, ``es-ES`` or ``auto``) and projected back
by ``prompt_kernel``. It is fine-tuned from the bundled English tiny model (``tiny_nemotron_asr.nemo``, built by
``scripts/make_tiny_model.py``): the English weights are loaded, ``prompt_kernel`` starts as the exact identity on
the encoder part, and the model is trained on English + Spanish espeak-ng speech with the five attention contexts
of :data:`pipecat_nemotron.asr.architectures.MULTILINGUAL_ATT_CONTEXT_SIZES` (including the 320 ms [56, 3]).

The English tokenizer (128 BPE pieces) is kept: it has every letter but ``j`` and ``q``, so Spanish is *spoken*
with its proper spelling (accents, ``ñ``) but *labelled* lower case and ASCII-folded (``mañana`` -> ``manana``),
over a vocabulary without ``j`` or ``q``.

Stages (each can be run alone; ``all`` runs them in order)::

    data    synthesise train/val/test utterances of both languages under data/tiny_asr_multilingual/
    train   convert the English model to the prompt class and fine-tune it (plain PyTorch loop, 1 thread)
    export  write the best checkpoint as pipecat_nemotron/assets/tiny_nemotron_asr_multilingual.nemo
    assets  write tests/assets/heldout_multilingual/ (24 English + 24 Spanish held-out clips, transcripts.json)
    eval    per-language WER with the right / wrong / auto prompt at the default and 160 ms contexts

Reproduce the bundled model (see docs/TINY_MULTILINGUAL_MODEL.md)::

    .venv/bin/python scripts/make_tiny_multilingual_model.py all
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tarfile
import time
import unicodedata
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_tiny_model import (  # noqa: E402
    TRAIN_BASES,
    TRAIN_VARIANTS,
    UttSpec,
    add_options,
    augment,
    compose_sentence,
    digit_string,
    make_specs,
    render_set,
    run_stages,
    synth_raw,
    vocabulary,
    write_wav,
)

from pipecat_nemotron.agent.wav_input import read_pcm16  # noqa: E402
from pipecat_nemotron.asr.architectures import (  # noqa: E402
    AUTO_LANGUAGE,
    MULTILINGUAL_ATT_CONTEXT_SIZES,
    prompt_model_defaults,
)
from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE  # noqa: E402
from pipecat_nemotron.bench.common import REPO_ROOT  # noqa: E402
from pipecat_nemotron.bench.wer import wer_percent  # noqa: E402
from pipecat_nemotron.models import ASSETS_DIR, TINY_MODEL_PATH  # noqa: E402

DATA_DIR = REPO_ROOT / "data" / "tiny_asr_multilingual"
RUN_DIR = REPO_ROOT / "runs" / "tiny_asr_multilingual"
MULTILINGUAL_MODEL_PATH = ASSETS_DIR / "tiny_nemotron_asr_multilingual.nemo"
HELDOUT_ML_DIR = REPO_ROOT / "tests" / "assets" / "heldout_multilingual"
ENGLISH_HELDOUT_DIR = REPO_ROOT / "tests" / "assets" / "heldout"
CARD = REPO_ROOT / "docs" / "TINY_MULTILINGUAL_MODEL.md"

LANGUAGES = ["en-US", "es-ES"]
PROMPTS: dict[str, int] = prompt_model_defaults(LANGUAGES)["prompt_dictionary"]
#: The 160 ms mode, the English model's default.
CONTEXT_160MS = [70, 1]

# --------------------------------------------------------------------------------------------------------------
# Spanish text: spoken with proper spelling, labelled lower case and ASCII-folded; no word has ``j`` or ``q``
# (the English tokenizer has no piece for them), so ``jueves``, ``quince`` and ``qué`` are left out.
# --------------------------------------------------------------------------------------------------------------
ES_BASES: tuple[str, ...] = ("es", "es-419")
ES_DIGITS = ("cero", "uno", "dos", "tres", "cuatro", "cinco", "seis", "siete", "ocho", "nueve")
ES_TIMER_NUMBERS = ES_DIGITS[2:] + ("diez", "once", "doce", "veinte", "treinta", "cuarenta")
ES_HOURS = ES_DIGITS[2:] + ("diez", "once", "doce")
ES_OPS = ("más", "menos", "por")
ES_DAYS = ("lunes", "martes", "miércoles", "viernes", "sábado", "domingo")
ES_GREETINGS = ("hola", "buenos días", "buenas tardes")
ES_POLITE_SUFFIX = ("por favor", "gracias", "muchas gracias")


def fold(text: str) -> str:
    """Lower case, accents and ``ñ`` folded to ASCII (``mañana`` -> ``manana``, ``sábado`` -> ``sabado``)."""
    decomposed = unicodedata.normalize("NFKD", text.lower())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def _es_core(rng: random.Random) -> str:
    """One core request/answer of a Spanish voice-agent turn (parallel to ``make_tiny_model._core``)."""
    k = rng.random()
    if k < 0.22:
        return f"cuánto es {rng.choice(ES_DIGITS)} {rng.choice(ES_OPS)} {rng.choice(ES_DIGITS)}"
    if k < 0.27:
        return f"{rng.choice(ES_DIGITS)} {rng.choice(ES_OPS)} {rng.choice(ES_DIGITS)}"
    if k < 0.34:
        return "dime la hora"
    if k < 0.47:
        when = rng.choice(("hoy", "mañana", "hoy", "mañana", *(f"el {d}" for d in ES_DAYS)))
        return f"cómo está el tiempo {when}"
    if k < 0.58:
        n = rng.choice(ES_TIMER_NUMBERS + ("un",))
        return "pon un temporizador de un minuto" if n == "un" else f"pon un temporizador de {n} minutos"
    if k < 0.64:
        return rng.choice(
            ("para", "cancela", "cancela el temporizador", "para el temporizador", "cancela eso")
        )
    if k < 0.74:
        return rng.choice(("mi número es ", "el código es ", "")) + digit_string(rng, 2, 6, ES_DIGITS)
    if k < 0.82:
        return rng.choice(("sí", "no", "sí por favor", "no gracias", "muchas gracias", "vale", "sí vale"))
    if k < 0.88:
        return f"recuérdame el {rng.choice(ES_DAYS)}" + (
            f" a las {rng.choice(ES_HOURS)}" if rng.random() < 0.5 else ""
        )
    if k < 0.93:
        return rng.choice(("dime el día de hoy", "dime el día de mañana", f"hoy es {rng.choice(ES_DAYS)}"))
    return rng.choice(ES_GREETINGS) + (f" {rng.choice(ES_GREETINGS)}" if rng.random() < 0.2 else "")


def es_sample_sentence(rng: random.Random) -> str:
    """A random Spanish sentence as spoken (accents, ``ñ``); its label is :func:`fold` of it."""
    return compose_sentence(rng, _es_core, ES_GREETINGS, "y ", ES_POLITE_SUFFIX)


def es_label(rng: random.Random) -> str:
    """A random Spanish sentence's training label (:func:`fold` of :func:`es_sample_sentence`)."""
    return fold(es_sample_sentence(rng))


def make_es_specs(
    rng: random.Random, n: int, split: str, prefix: str, aug: str, max_words: int | None = None
) -> list[UttSpec]:
    """Spanish utterance specs (spoken text) whose folded sentences fall in ``split`` (``heldout_bucket``)."""
    return make_specs(
        rng, n, split, prefix, ES_BASES, TRAIN_VARIANTS, aug, es_sample_sentence, fold, max_words
    )


def _label_manifest(rows: list[dict[str, Any]], manifest: Path, language: str) -> list[dict[str, Any]]:
    """Rewrite a rendered manifest with folded labels and the language (the spoken text is kept as ``spoken``)."""
    out = []
    with manifest.open("w") as f:
        for r in rows:
            row = {**r, "spoken": r["text"], "text": fold(r["text"]), "language": language}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            out.append(row)
    return out


def _check_tokenizer_coverage(texts: Sequence[str], tokenizer_model: Path) -> None:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_model))
    bad = sorted({w for t in texts for w in t.split() if sp.unk_id() in sp.encode(w)})
    if bad:
        raise SystemExit(f"words the English tokenizer cannot spell (unk): {bad}")


def stage_data(args: argparse.Namespace) -> None:
    """Synthesise English and Spanish train / val / test sets; the ``test`` sets feed the model card's WERs."""
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    sets: dict[str, tuple[list[UttSpec], str]] = {
        "train_en": (
            make_specs(rng, args.n_train_en, "train", "train_en", TRAIN_BASES, TRAIN_VARIANTS, "train"),
            "en-US",
        ),
        "train_es": (make_es_specs(rng, args.n_train_es, "train", "train_es", "train"), "es-ES"),
        "val_en": (
            make_specs(rng, args.n_val, "val", "val_en", TRAIN_BASES, TRAIN_VARIANTS, "light"),
            "en-US",
        ),
        "val_es": (make_es_specs(rng, args.n_val, "val", "val_es", "light"), "es-ES"),
        "test_en": (
            make_specs(rng, args.n_test, "test", "test_en", TRAIN_BASES, TRAIN_VARIANTS, "light"),
            "en-US",
        ),
        "test_es": (make_es_specs(rng, args.n_test, "test", "test_es", "light"), "es-ES"),
    }
    tok_dir = extract_tokenizer(TINY_MODEL_PATH, DATA_DIR / "tokenizer")
    _check_tokenizer_coverage(
        [fold(s.text) for specs, _ in sets.values() for s in specs] + vocabulary(es_label, 100_000),
        tok_dir / "tokenizer.model",
    )
    for name, (specs, lang) in sets.items():
        rows = render_set(specs, DATA_DIR / name, DATA_DIR / f"{name}_manifest.json", args.workers)
        _label_manifest(rows, DATA_DIR / f"{name}_manifest.json", lang)
    train_texts = {json.loads(line)["text"] for n in ("train_en", "train_es") for line in _lines(n)}
    for n in ("val_en", "val_es", "test_en", "test_es"):
        overlap = {json.loads(line)["text"] for line in _lines(n)} & train_texts
        if overlap:
            raise SystemExit(f"{n}: {len(overlap)} sentences also in training")
    print("[data] no validation or test sentence occurs in training", flush=True)


def _lines(name: str) -> list[str]:
    return (DATA_DIR / f"{name}_manifest.json").read_text().splitlines()


def load_rows(name: str) -> list[dict[str, Any]]:
    """Rows of ``data/tiny_asr_multilingual/<name>_manifest.json``."""
    return [json.loads(line) for line in _lines(name)]


# --------------------------------------------------------------------------------------------------------------
# Model: the English tiny model converted to the prompt class
# --------------------------------------------------------------------------------------------------------------
def extract_tokenizer(nemo_path: Path, out_dir: Path) -> Path:
    """The tokenizer files inside a ``.nemo`` as ``out_dir/{tokenizer.model, tokenizer.vocab, vocab.txt}``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(nemo_path) as tar:
        for member in tar.getmembers():
            base = Path(member.name).name
            for suffix in ("tokenizer.model", "tokenizer.vocab", "vocab.txt"):
                if base.endswith("_" + suffix) or base == suffix:
                    f = tar.extractfile(member)
                    assert f is not None
                    (out_dir / suffix).write_bytes(f.read())
    missing = [s for s in ("tokenizer.model", "vocab.txt") if not (out_dir / s).exists()]
    if missing:
        raise SystemExit(f"{nemo_path} holds no {missing}")
    return out_dir


def _quiet() -> Any:
    import logging

    from pipecat_nemotron.runtime.nemo_logs import quiet_nemo

    return quiet_nemo(logging.ERROR)


def restore(path: Path | str) -> Any:
    """``ASRModel.restore_from(path)`` on CPU, in eval mode."""
    with _quiet():
        from nemo.collections.asr.models import ASRModel

        model = ASRModel.restore_from(str(path), map_location="cpu")
    model.eval()
    return model


def set_prompt_identity(model: Any) -> None:
    """``prompt_kernel`` = the exact identity on the encoder part (prompt columns zero):
    ``Linear([[I, 0], [-I, 0]]) -> ReLU -> Linear([I, -I])`` gives ``relu(x) - relu(-x) = x``."""
    import torch

    first, second = model.prompt_kernel[0], model.prompt_kernel[2]
    d = second.out_features
    eye = torch.eye(d)
    with torch.no_grad():
        first.weight.zero_()
        first.weight[:d, :d] = eye
        first.weight[d:, :d] = -eye
        first.bias.zero_()
        second.weight.copy_(torch.cat([eye, -eye], dim=1))
        second.bias.zero_()


def convert_english_model(english_path: Path, tok_dir: Path) -> Any:
    """The English tiny model as an ``EncDecHybridRNNTCTCBPEModelWithPrompt`` (five attention contexts, language
    prompts ``en-US``/``es-ES``/``auto``), English weights loaded and ``prompt_kernel`` set to the identity."""
    from nemo.collections.asr.models import EncDecHybridRNNTCTCBPEModelWithPrompt
    from omegaconf import OmegaConf, open_dict

    english = restore(english_path)
    cfg = OmegaConf.create(OmegaConf.to_container(english.cfg, resolve=True))
    with open_dict(cfg):
        cfg.tokenizer = {"dir": str(tok_dir), "type": "bpe"}
        # restore_from instantiates the class named here (the English config names the English class)
        cfg.target = f"{EncDecHybridRNNTCTCBPEModelWithPrompt.__module__}.{EncDecHybridRNNTCTCBPEModelWithPrompt.__name__}"
        cfg.model_defaults.update(prompt_model_defaults(LANGUAGES))
        cfg.encoder.att_context_size = [list(c) for c in MULTILINGUAL_ATT_CONTEXT_SIZES]
        n = len(MULTILINGUAL_ATT_CONTEXT_SIZES)
        cfg.encoder.att_context_probs = [1.0 / n] * n
        cfg.decoding.greedy.use_cuda_graph_decoder = False
        for key in ("train_ds", "validation_ds", "test_ds"):
            if key in cfg:
                cfg[key].manifest_filepath = None
    with _quiet():
        model = EncDecHybridRNNTCTCBPEModelWithPrompt(cfg=cfg)
    result = model.load_state_dict(english.state_dict(), strict=False)
    missing = [k for k in result.missing_keys if not k.startswith("prompt_kernel.")]
    if missing or result.unexpected_keys:
        raise SystemExit(f"weights do not match: missing {missing}, unexpected {result.unexpected_keys}")
    set_prompt_identity(model)
    model.eval()
    _check_identity(english, model)
    return model


def _check_identity(english: Any, model: Any) -> None:
    """The converted model's offline output must equal the English model's (every prompt, two contexts)."""
    import torch

    rows = json.loads((ENGLISH_HELDOUT_DIR / "manifest.json").read_text())[:8]
    audio, lens = _batch_audio([_read_audio(ENGLISH_HELDOUT_DIR / r["audio"]) for r in rows])
    for ctx in ([70, 1], [70, 13]):
        english.encoder.set_default_att_context_size(ctx)
        model.encoder.set_default_att_context_size(ctx)
        with torch.no_grad():
            ref, ref_len = english.forward(input_signal=audio, input_signal_length=lens)
            ref_text = decode(english, ref, ref_len)
            for idx in PROMPTS.values():
                prompts = torch.full((len(rows),), idx, dtype=torch.long)
                enc, enc_len = model.forward(
                    input_signal=audio, input_signal_length=lens, prompt_indices=prompts
                )
                diff = float((enc - ref).abs().max())
                text = decode(model, enc, enc_len)
                if diff > 1e-4 or text != ref_text or not torch.equal(enc_len, ref_len):
                    raise SystemExit(f"converted model differs from the English model: {ctx} {idx} {diff}")
                print(
                    f"[convert] context {ctx} prompt {idx}: max |diff| {diff:.2e}, transcripts equal",
                    flush=True,
                )
    model.encoder.set_default_att_context_size(MULTILINGUAL_ATT_CONTEXT_SIZES[0])


def _read_audio(path: Path) -> np.ndarray:
    if path.suffix == ".flac":
        import soundfile

        x, sr = soundfile.read(str(path), dtype="int16")
        assert sr == MODEL_SAMPLE_RATE
        return x
    return read_pcm16(path)


def _batch_audio(clips: Sequence[np.ndarray]) -> tuple[Any, Any]:
    import torch

    lens = torch.tensor([c.size for c in clips], dtype=torch.long)
    audio = torch.zeros(len(clips), int(lens.max()))
    for i, c in enumerate(clips):
        audio[i, : c.size] = torch.from_numpy(c.astype(np.float32) / 32768.0)
    return audio, lens


def decode(model: Any, encoded: Any, encoded_len: Any) -> list[str]:
    """Greedy RNNT transcripts of a batch of encoder outputs."""
    hyps = model.decoding.rnnt_decoder_predictions_tensor(encoder_output=encoded, encoded_lengths=encoded_len)
    if isinstance(hyps, tuple):
        hyps = hyps[0]
    return [h.text if hasattr(h, "text") else str(h) for h in hyps]


def transcribe(
    model: Any, clips: Sequence[np.ndarray], prompt: int | None, batch_size: int = 32
) -> list[str]:
    """Offline (full-utterance) greedy transcripts; ``prompt`` None for a model without prompts."""
    import torch

    order = sorted(range(len(clips)), key=lambda i: clips[i].size)
    out: dict[int, str] = {}
    with torch.no_grad():
        for s in range(0, len(order), batch_size):
            ids = order[s : s + batch_size]
            audio, lens = _batch_audio([clips[i] for i in ids])
            kw = (
                {}
                if prompt is None
                else {"prompt_indices": torch.full((len(ids),), prompt, dtype=torch.long)}
            )
            enc, enc_len = model.forward(input_signal=audio, input_signal_length=lens, **kw)
            for i, t in zip(ids, decode(model, enc, enc_len), strict=True):
                out[i] = t
    return [out[i] for i in range(len(clips))]


def wer(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """Corpus word error rate as a fraction (the engine tests' :func:`wer_percent` / 100)."""
    return (wer_percent(refs, hyps) or 0.0) / 100.0


# --------------------------------------------------------------------------------------------------------------
# Training: a plain PyTorch loop (the prompt class's Lightning dataloaders want lhotse cuts)
# --------------------------------------------------------------------------------------------------------------
def _load_set(name: str) -> tuple[list[np.ndarray], list[str], list[int]]:
    rows = load_rows(name)
    clips = [read_pcm16(Path(r["audio_filepath"])) for r in rows]
    return clips, [r["text"] for r in rows], [PROMPTS[r["language"]] for r in rows]


def _batches(durations: Sequence[float], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Duration-sorted batches (with 10% jitter so batches differ between epochs), in random order."""
    keys = sorted(range(len(durations)), key=lambda i: durations[i] * rng.uniform(0.9, 1.1))
    batches = [keys[i : i + batch_size] for i in range(0, len(keys), batch_size)]
    rng.shuffle(batches)
    return batches


def validate(
    model: Any, sets: dict[str, tuple[list[np.ndarray], list[str], list[int]]], ctx: list[int]
) -> dict:
    """Greedy WER per language with the right prompt at context ``ctx``."""
    was_training = model.training
    model.eval()
    model.encoder.set_default_att_context_size(ctx)
    res = {}
    for name, (clips, texts, prompts) in sets.items():
        res[name] = wer(transcribe(model, clips, prompts[0]), texts)
    model.encoder.set_default_att_context_size(MULTILINGUAL_ATT_CONTEXT_SIZES[0])
    model.train(was_training)
    return res


def rnnt_loss_fast(logits: Any, targets: Any, input_lengths: Any, target_lengths: Any) -> Any:
    """RNNT loss, mean over the batch of ``-log P(y|x)`` (NeMo's ``mean_batch``), vectorised over ``u``.

    Same value as NeMo's ``pytorch`` loss (checked: 600.829 on a batch for both) but ~10x faster on CPU: the
    forward variable is computed frame by frame, and within a frame the recursion
    ``alpha[t,u] = logaddexp(alpha[t-1,u] + blank[t-1,u], alpha[t,u-1] + emit[t,u-1])`` is one ``logcumsumexp``
    of ``alpha[t-1,k] + blank[t-1,k] - c[t,k]`` plus ``c[t,u]`` (``c`` = cumulative emission log-probs), in float64.
    """
    import torch

    lp = logits.log_softmax(dim=-1)
    b, t_max, u1, v = lp.shape
    u = u1 - 1
    blank = lp[..., v - 1].double()
    emit = torch.gather(lp[:, :, :u, :], 3, targets[:, None, :u, None].expand(b, t_max, u, 1)).squeeze(-1)
    c = torch.cat([blank.new_zeros(b, t_max, 1), emit.double().cumsum(-1)], dim=-1)
    alphas = [c[:, 0]]
    for t in range(1, t_max):
        alphas.append(c[:, t] + torch.logcumsumexp(alphas[-1] + blank[:, t - 1] - c[:, t], dim=-1))
    alpha = torch.stack(alphas, 1)
    bi = torch.arange(b)
    tl, ul = input_lengths.long() - 1, target_lengths.long()
    return (-(alpha[bi, tl, ul] + blank[bi, tl, ul])).mean().float()


def _training_set(model: Any) -> tuple[list[np.ndarray], list[list[int]], list[int]]:
    """English + Spanish training clips, their token ids and their language prompt indices."""
    clips: list[np.ndarray] = []
    texts: list[str] = []
    prompts: list[int] = []
    for name in ("train_en", "train_es"):
        c, t, p = _load_set(name)
        clips += c
        texts += t
        prompts += p
    return clips, [model.tokenizer.text_to_ids(t) for t in texts], prompts


def _rnnt_loss(args: argparse.Namespace, model: Any) -> Any:
    if args.rnnt_loss == "fast":
        return _FastLoss()
    if args.rnnt_loss == "model":
        return model.loss
    from nemo.collections.asr.losses.rnnt import RNNTLoss

    return RNNTLoss(num_classes=model.joint.num_classes_with_blank - 1, loss_name=args.rnnt_loss)


def batch_loss(
    model: Any,
    rnnt_loss: Any,
    ctc_weight: float,
    clips: Sequence[np.ndarray],
    tokens: Sequence[list[int]],
    prompts: Sequence[int],
) -> Any:
    """``(1 - w) * RNNT + w * CTC`` of one batch, as the prompt class's ``training_step`` computes it."""
    import torch

    audio, lens = _batch_audio(clips)
    tl = torch.tensor([len(t) for t in tokens], dtype=torch.long)
    targets = torch.zeros(len(tokens), int(tl.max()), dtype=torch.long)
    for j, t in enumerate(tokens):
        targets[j, : len(t)] = torch.tensor(t)
    encoded, encoded_len = model.forward(
        input_signal=audio, input_signal_length=lens, prompt_indices=torch.tensor(prompts, dtype=torch.long)
    )
    decoder, target_length, _ = model.decoder(targets=targets, target_length=tl)
    joint = model.joint(encoder_outputs=encoded, decoder_outputs=decoder)
    loss = rnnt_loss(
        log_probs=joint, targets=targets, input_lengths=encoded_len, target_lengths=target_length
    )
    log_probs = model.ctc_decoder(encoder_output=encoded)
    ctc = model.ctc_loss(log_probs=log_probs, targets=targets, input_lengths=encoded_len, target_lengths=tl)
    return (1 - ctc_weight) * loss + ctc_weight * ctc


def stage_train(args: argparse.Namespace) -> None:
    """Convert the English model and fine-tune it on both languages within a wall-clock budget."""
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)  # the encoder draws each forward's attention context from ``random``
    run_dir = Path(args.run_dir)
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    log = (run_dir / "train.log").open("a")

    def say(msg: str) -> None:
        print(msg, flush=True)
        log.write(msg + "\n")
        log.flush()

    tok_dir = extract_tokenizer(TINY_MODEL_PATH, DATA_DIR / "tokenizer")
    model = convert_english_model(TINY_MODEL_PATH, tok_dir)
    say(f"[train] {type(model).__name__}; contexts {model.encoder.att_context_size_all}")
    say(f"[train] att_context_probs {model.encoder.att_context_probs}; prompts {PROMPTS}")

    train_clips, train_tokens, train_prompts = _training_set(model)
    durations = [c.size / MODEL_SAMPLE_RATE for c in train_clips]
    val_sets = {"en": _load_set("val_en"), "es": _load_set("val_es")}
    say(f"[train] {len(train_clips)} training utterances ({sum(durations) / 3600:.2f} h)")

    rnnt_loss = _rnnt_loss(args, model)
    ctc_weight = float(model.cfg.aux_ctc.ctc_loss_weight)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=1e-3)
    rng = random.Random(args.seed)

    def lr_at(step: int, elapsed_min: float) -> float:
        if step < args.warmup_steps:
            return args.lr * (step + 1) / args.warmup_steps
        frac = min(1.0, max(step / args.max_steps, elapsed_min / args.max_minutes))
        return args.min_lr + (args.lr - args.min_lr) * 0.5 * (1 + math.cos(math.pi * frac))

    def evaluate_and_keep(step: int) -> None:
        nonlocal best
        t = time.perf_counter()
        v = validate(model, val_sets, MULTILINGUAL_ATT_CONTEXT_SIZES[0])
        v160 = validate(model, val_sets, CONTEXT_160MS)
        score = (v["en"] + v["es"] + v160["en"] + v160["es"]) / 4
        say(
            f"[val] step {step}: WER default en {v['en']:.3f} es {v['es']:.3f}; 160 ms en {v160['en']:.3f} "
            f"es {v160['es']:.3f}; mean {score:.4f} ({time.perf_counter() - t:.0f} s)"
        )
        if best is None or score < best[0]:
            best = (score, step)
            torch.save(model.state_dict(), run_dir / "checkpoints" / "best.pt")
            say(f"[val] new best {score:.4f} at step {step}")

    best: tuple[float, int] | None = None
    evaluate_and_keep(0)
    t0 = time.perf_counter()
    step, loss_avg, n_avg, last_print = 0, 0.0, 0, t0
    done = False
    model.train()
    while not done:
        for ids in _batches(durations, args.batch_size, rng):
            elapsed = (time.perf_counter() - t0) / 60
            if step >= args.max_steps or elapsed >= args.max_minutes:
                done = True
                break
            for g in opt.param_groups:
                g["lr"] = lr_at(step, elapsed)
            prompts = [AUTO_INDEX if rng.random() < args.p_auto else train_prompts[i] for i in ids]
            loss = batch_loss(
                model,
                rnnt_loss,
                ctc_weight,
                [train_clips[i] for i in ids],
                [train_tokens[i] for i in ids],
                prompts,
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            loss_avg += float(loss.detach())
            n_avg += 1
            if step % args.print_every == 0:
                now = time.perf_counter()
                say(
                    f"[train] step {step} loss {loss_avg / n_avg:.3f} lr {opt.param_groups[0]['lr']:.2e} "
                    f"{args.print_every / (now - last_print):.2f} steps/s elapsed {(now - t0) / 60:.1f} min"
                )
                loss_avg, n_avg, last_print = 0.0, 0, now
            if step % args.val_every == 0:
                evaluate_and_keep(step)
                model.train()
    minutes = (time.perf_counter() - t0) / 60
    evaluate_and_keep(step)
    assert best is not None
    info = {
        "train_minutes": round(minutes, 1),
        "steps": step,
        "best_step": best[1],
        "best_val_mean_wer": best[0],
        "train_utterances": len(train_clips),
        "train_hours": round(sum(durations) / 3600, 2),
        "args": vars(args),
    }
    (run_dir / "train_info.json").write_text(json.dumps(info, indent=1, default=str))
    say(f"[train] done: {json.dumps(info, default=str)}")


AUTO_INDEX = PROMPTS[AUTO_LANGUAGE]


class _FastLoss:
    """:func:`rnnt_loss_fast` with the call shape of NeMo's ``RNNTLoss``."""

    def __call__(self, log_probs: Any, targets: Any, input_lengths: Any, target_lengths: Any) -> Any:
        return rnnt_loss_fast(log_probs, targets, input_lengths, target_lengths)


def stage_export(args: argparse.Namespace) -> None:
    """Best weights -> ``.nemo``; check that it restores as the prompt class with the five contexts."""
    import torch

    tok_dir = extract_tokenizer(TINY_MODEL_PATH, DATA_DIR / "tokenizer")
    model = convert_english_model(TINY_MODEL_PATH, tok_dir)
    model.load_state_dict(torch.load(Path(args.run_dir) / "checkpoints" / "best.pt", map_location="cpu"))
    model.eval()
    out = Path(args.out)
    with _quiet():
        model.save_to(str(out))
    restored = restore(out)
    checks = {
        "class": type(restored).__name__,
        "concat": restored.concat,
        "att_context_size_all": restored.encoder.att_context_size_all,
        "prompt_dictionary": dict(restored.cfg.model_defaults.prompt_dictionary),
        "use_cuda_graph_decoder": restored.cfg.decoding.greedy.use_cuda_graph_decoder,
    }
    ok = (
        checks["class"] == "EncDecHybridRNNTCTCBPEModelWithPrompt"
        and checks["concat"] is True
        and [list(c) for c in checks["att_context_size_all"]] == MULTILINGUAL_ATT_CONTEXT_SIZES
        and checks["prompt_dictionary"] == PROMPTS
        and checks["use_cuda_graph_decoder"] is False
    )
    print(f"[export] {out} ({out.stat().st_size / 1e6:.2f} MB): {checks}", flush=True)
    if not ok:
        raise SystemExit("the exported model does not restore as expected")


# --------------------------------------------------------------------------------------------------------------
# Held-out test assets
# --------------------------------------------------------------------------------------------------------------
def stage_assets(args: argparse.Namespace) -> None:
    """24 English + 24 Spanish held-out clips (new sentences, training voices, light augmentation) and
    ``transcripts.json`` (file -> {text, language}) under tests/assets/heldout_multilingual/."""
    rng = random.Random(args.seed + 7)
    if HELDOUT_ML_DIR.exists():
        for p in HELDOUT_ML_DIR.iterdir():
            p.unlink()
    HELDOUT_ML_DIR.mkdir(parents=True, exist_ok=True)
    transcripts: dict[str, dict[str, str]] = {}
    used: set[str] = set()  # distinct sentences (short held-out sentences repeat often)
    for lang, prefix in (("en-US", "en"), ("es-ES", "es")):
        kept = 0
        while kept < args.n_assets:
            if lang == "en-US":
                spec = make_specs(rng, 1, "test", prefix, TRAIN_BASES, TRAIN_VARIANTS, "light")[0]
            else:
                spec = make_es_specs(rng, 1, "test", prefix, "light")[0]
            if fold(spec.text) in used:
                continue
            spec = UttSpec(**{**asdict(spec), "speed": max(spec.speed, 170)})
            x = augment(
                synth_raw(spec.text, spec.voice, spec.speed, spec.pitch, spec.gap), spec.seed, "light"
            )
            if x.size > args.max_asset_s * MODEL_SAMPLE_RATE:
                continue
            name = f"{prefix}_{kept:02d}.wav"
            write_wav(HELDOUT_ML_DIR / name, x)
            transcripts[name] = {"text": fold(spec.text), "language": lang, "voice": spec.voice}
            used.add(fold(spec.text))
            kept += 1
    (HELDOUT_ML_DIR / "transcripts.json").write_text(
        json.dumps(transcripts, indent=1, ensure_ascii=False) + "\n"
    )
    train_texts = {json.loads(line)["text"] for n in ("train_en", "train_es") for line in _lines(n)}
    leaked = [v["text"] for v in transcripts.values() if v["text"] in train_texts]
    if leaked:
        raise SystemExit(f"held-out sentences found in training: {leaked}")
    total = sum(p.stat().st_size for p in HELDOUT_ML_DIR.iterdir())
    print(f"[assets] {HELDOUT_ML_DIR}: {len(transcripts)} clips, {total / 1e6:.2f} MB", flush=True)


# --------------------------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------------------------
def stage_eval(args: argparse.Namespace) -> None:
    """Offline per-language WER (right / wrong / auto prompt; default and 160 ms contexts) and the English
    regression check on tests/assets/heldout; written to runs/.../eval.json and the model card's table."""
    import torch

    torch.set_num_threads(args.threads)
    model = restore(args.out)
    default_ctx = list(model.encoder.att_context_size_all[0])
    sets = {"en-US": _load_set("test_en"), "es-ES": _load_set("test_es")}
    wrong = {"en-US": "es-ES", "es-ES": "en-US"}
    results: dict[str, Any] = {"internal_test": {}, "heldout_assets": {}, "english_regression": {}}
    for ctx in (default_ctx, CONTEXT_160MS):
        model.encoder.set_default_att_context_size(ctx)
        for lang, (clips, texts, _) in sets.items():
            for kind, key in (("right", lang), ("wrong", wrong[lang]), ("auto", AUTO_LANGUAGE)):
                w = wer(transcribe(model, clips, PROMPTS[key]), texts)
                results["internal_test"][f"{ctx}|{lang}|{kind}"] = w
                print(f"[eval] test {lang} context {ctx} prompt {kind} ({key}): WER {w:.2%}", flush=True)
        # the 48 bundled held-out clips
        tr = json.loads((HELDOUT_ML_DIR / "transcripts.json").read_text())
        for lang in LANGUAGES:
            names = [n for n, v in tr.items() if v["language"] == lang]
            clips = [read_pcm16(HELDOUT_ML_DIR / n) for n in names]
            refs = [tr[n]["text"] for n in names]
            for kind, key in (("right", lang), ("wrong", wrong[lang]), ("auto", AUTO_LANGUAGE)):
                w = wer(transcribe(model, clips, PROMPTS[key]), refs)
                results["heldout_assets"][f"{ctx}|{lang}|{kind}"] = w
                print(
                    f"[eval] heldout_multilingual {lang} context {ctx} prompt {kind}: WER {w:.2%}", flush=True
                )
    # English regression: the English model's own held-out clips, original vs fine-tuned (en-US prompt)
    rows = json.loads((ENGLISH_HELDOUT_DIR / "manifest.json").read_text())
    clips = [_read_audio(ENGLISH_HELDOUT_DIR / r["audio"]) for r in rows]
    refs = [r["text"] for r in rows]
    english = restore(TINY_MODEL_PATH)
    for ctx in (CONTEXT_160MS, [70, 13]):
        english.encoder.set_default_att_context_size(ctx)
        model.encoder.set_default_att_context_size(ctx)
        for split in ("seen_voice", "unseen_voice", "all"):
            idx = [i for i, r in enumerate(rows) if split in ("all", r["split"])]
            c, rf = [clips[i] for i in idx], [refs[i] for i in idx]
            w_en = wer(transcribe(english, c, None), rf)
            w_ml = wer(transcribe(model, c, PROMPTS["en-US"]), rf)
            w_auto = wer(transcribe(model, c, AUTO_INDEX), rf)
            results["english_regression"][f"{ctx}|{split}"] = {
                "english_model": w_en,
                "multilingual_en_prompt": w_ml,
                "multilingual_auto": w_auto,
                "n": len(idx),
            }
            print(
                f"[eval] tests/assets/heldout {split} ({len(idx)}) context {ctx}: English model {w_en:.2%}, "
                f"multilingual en-US {w_ml:.2%}, auto {w_auto:.2%}",
                flush=True,
            )
    out = Path(args.run_dir) / "eval.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"[eval] -> {out}", flush=True)
    print(markdown_tables(results, default_ctx), flush=True)


def markdown_tables(results: dict[str, Any], default_ctx: list[int]) -> str:
    """The model card's WER tables from :func:`stage_eval`'s results."""
    lines = []
    for key, title in (
        ("internal_test", "internal test set"),
        ("heldout_assets", "tests/assets/heldout_multilingual"),
    ):
        lines += [
            f"WER, {title}:",
            "",
            "| audio | context | right prompt | wrong prompt | auto |",
            "|---|---|---|---|---|",
        ]
        for lang in LANGUAGES:
            for ctx in (default_ctx, CONTEXT_160MS):
                r = results[key]
                cells = " | ".join(f"{100 * r[f'{ctx}|{lang}|{k}']:.1f}%" for k in ("right", "wrong", "auto"))
                lines.append(f"| {lang} | {ctx} | {cells} |")
        lines.append("")
    lines += [
        "English regression, tests/assets/heldout:",
        "",
        "| split | context | English model | multilingual, en-US | multilingual, auto |",
        "|---|---|---|---|---|",
    ]
    for k, v in results["english_regression"].items():
        ctx, split = k.split("|")
        lines.append(
            f"| {split} ({v['n']}) | {ctx} | {100 * v['english_model']:.1f}% | "
            f"{100 * v['multilingual_en_prompt']:.1f}% | {100 * v['multilingual_auto']:.1f}% |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------------
DATA_OPTIONS: dict[str, tuple[Any, str]] = {
    "workers": (2, "processes for synthesis"),
    "n_train_en": (3000, "English training utterances"),
    "n_train_es": (4000, "Spanish training utterances"),
    "n_val": (150, "validation utterances per language (new sentences)"),
    "n_test": (150, "internal test utterances per language (new sentences, for the model card)"),
    "n_assets": (24, "bundled held-out clips per language"),
    "max_asset_s": (1.8, "longest bundled held-out clip, seconds (keeps the folder small)"),
}
TRAINING_OPTIONS: dict[str, tuple[Any, str | None]] = {
    "batch_size": (16, None),
    "lr": (5e-4, "peak learning rate (AdamW)"),
    "min_lr": (2e-5, None),
    "warmup_steps": (100, None),
    "max_steps": (100000, None),
    "max_minutes": (46.0, "wall-clock budget: the cosine decay ends and training stops by then"),
    "val_every": (400, None),
    "print_every": (25, None),
    "threads": (1, "torch threads"),
    "p_auto": (0.25, "probability that a training utterance gets the auto prompt"),
    "rnnt_loss": (
        "fast",
        "RNNT loss: 'fast' (rnnt_loss_fast), 'model' (NeMo's pure PyTorch), or a NeMo loss_name",
    ),
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "stages",
        nargs="+",
        choices=["all", "data", "train", "export", "assets", "eval"],
        help="stages to run, in the order given ('all' = data train export assets eval)",
    )
    p.add_argument("--seed", type=int, default=4321)
    add_options(p.add_argument_group("data"), DATA_OPTIONS)
    add_options(p.add_argument_group("training"), TRAINING_OPTIONS)
    p.add_argument("--run-dir", default=str(RUN_DIR))
    p.add_argument("--out", default=str(MULTILINGUAL_MODEL_PATH))
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the requested stages."""
    stages = {
        "data": stage_data,
        "train": stage_train,
        "export": stage_export,
        "assets": stage_assets,
        "eval": stage_eval,
    }
    run_stages(parse_args(argv), stages, ["data", "train", "export", "assets", "eval"])


if __name__ == "__main__":
    main()
