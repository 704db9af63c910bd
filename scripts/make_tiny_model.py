#!/usr/bin/env python
"""Build the tiny cache-aware streaming FastConformer model bundled with pipecat_nemotron.

The model is of the same family as ``nvidia/nemotron-speech-streaming-en-0.6b`` (8x ``dw_striding``
subsampling, causal convolutions, ``chunked_limited`` attention with the four lookaheads
``[[70,1],[70,0],[70,6],[70,13]]`` trained jointly, RNNT decoder) but tiny (4 layers, ~2M parameters), trained on
CPU from speech synthesised with espeak-ng over a small voice-agent vocabulary.

Stages (each can be run alone; ``all`` runs them in order)::

    data      synthesise train/val/test utterances under data/tiny_asr/ (16 kHz mono int16 wav + manifests)
    accents   synthesise the accent-mix training set (phonemes of one accent spoken by another, perturbed)
    sessions  join pairs of training utterances with a pause into multi-turn training clips
    turns     2-3 training utterances with live-session pauses (0.3-3 s) as multi-turn clips (cased fine-tune)
    paused    training utterances with a 0.3-1 s pause inside the sentence (cased fine-tune)
    tokenizer train a ~128-piece SentencePiece BPE tokenizer on the training transcripts
    heldout   (re)generate only the full held-out test sets (a few hundred utterances each)
    train     one training run with NeMo's Lightning path on CPU (options below); checkpoints under --run-dir
    recipe    the bundled model's five training phases (runs/tiny_asr/, runs/tiny_asr_p2/ ... _p5/)
    export    write the best checkpoint as pipecat_nemotron/assets/tiny_nemotron_asr.nemo
    assets    write pipecat_nemotron/assets/demo/ and tests/assets/heldout/ from held-out sentences

Reproduce the lower-case phase-5 model (data ~10 min; training ~3.1 h on a 2-core CPU, see docs/TINY_MODEL.md)::

    .venv/bin/python scripts/make_tiny_model.py all

The bundled model is its cased, punctuated fine-tune (the ``turns``, ``paused``, ``silences`` and ``cased`` stages,
a 256-piece cased tokenizer and six ``train`` runs): docs/TINY_MODEL.md, *Cased, punctuated output*, lists them.

Everything is seeded: the same seed gives byte-identical audio (``sox -D`` disables dither) and the same data
splits. CPU training is deterministic up to thread scheduling of floating-point reductions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import random
import re
import shutil
import subprocess
import sys
import time
import wave
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipecat_nemotron.agent.wav_input import read_pcm16
from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE
from pipecat_nemotron.asr.config import LATENCY_MODES, LEFT_CONTEXT_FRAMES
from pipecat_nemotron.bench.audio import HELDOUT_DIR
from pipecat_nemotron.bench.common import REPO_ROOT
from pipecat_nemotron.models import DEMO_AUDIO_DIR, TINY_MODEL_PATH

DATA_DIR = REPO_ROOT / "data" / "tiny_asr"
RUN_DIR = REPO_ROOT / "runs" / "tiny_asr"

# --------------------------------------------------------------------------------------------------------------
# Voices. espeak-ng voice = base language/accent + optional "+variant" (formant/pitch personality).
# "Unseen" voices combine a base accent never used in training, or a variant never used in training.
# --------------------------------------------------------------------------------------------------------------
TRAIN_BASES: tuple[str, ...] = (
    "en-us",
    "en-gb",
    "en-gb-scotland",
    "en-gb-x-rp",
    "en-gb-x-gbclan",
    "en-029",
    "en-us-nyc",
)
UNSEEN_BASES: tuple[str, ...] = ("en-gb-x-gbcwmd",)
TRAIN_VARIANTS: tuple[str, ...] = (
    "",  # the base voice itself
    "m1", "m2", "m3", "m5", "m6", "m7", "m8",
    "f1", "f2", "f3", "f5",
    "Alex", "Alicia", "Andrea", "Annie", "aunty", "belinda", "benjamin", "boris", "caleb", "david",
    "Denis", "Diogo", "ed", "edward", "Gene", "gustave", "Henrique", "Hugo", "iven", "iven2",
    "Jacky", "john", "Lee", "linda", "marcelo", "Marco", "max", "Michael", "michel", "miguel",
    "norbert", "pablo", "paul", "pedro", "quincy", "rob", "robert", "sandro", "shelby", "steph",
    "steph3", "victor", "zac", "grandma", "klatt", "klatt2", "adam", "anxiousAndy", "Storm",
)  # fmt: skip
UNSEEN_VARIANTS: tuple[str, ...] = (
    "m4",
    "f4",
    "Andy",
    "steph2",
    "klatt4",
    "Mike",
    "anika",
    "travis",
    "iven3",
)
# Variants used only by the accent-mix set (``accents`` stage). None is a relative of an unseen variant
# (``anikaRobot`` is left out next to ``anika``, ``klatt3``/``klatt5``/``klatt6`` are separate klatt voices).
EXTRA_TRAIN_VARIANTS: tuple[str, ...] = (
    "antonio", "edward2", "Gene2", "announcer", "iven4", "kaukovalta", "Mario", "Mr", "Nguyen",
    "RicishayMax", "RicishayMax2", "robosoft", "robosoft3", "Tweaky", "fast", "grandpa", "klatt3",
    "klatt5", "klatt6", "croak",
)  # fmt: skip

# Accent mixing: a sentence is phonemised by one training accent's rules (``espeak-ng -x``), its phonemes are
# perturbed the way accents differ (neighbouring vowels swapped, initial /h/ dropped), and it is spoken by another
# training accent's phoneme table. Generic phonetic neighbours of English vowels (espeak-ng mnemonics).
VOWEL_NEIGHBOURS: dict[str, tuple[str, ...]] = {
    "V": ("U", "0", "a"),
    "0": ("A:", "O:", "V"),
    "a": ("E", "A:", "V"),
    "A:": ("a", "0"),
    "E": ("a", "I", "eI"),
    "I": ("i:", "E"),
    "i:": ("I", "eI"),
    "U": ("u:", "V"),
    "u:": ("U", "oU"),
    "eI": ("aI", "E", "i:"),
    "aI": ("OI", "A:", "eI"),
    "oU": ("aU", "O:", "u:"),
    "aU": ("a", "oU"),
    "O:": ("0", "oU"),
    "3:": ("@", "E"),
}

# --------------------------------------------------------------------------------------------------------------
# Text: a small voice-agent vocabulary, lower case, no punctuation.
# --------------------------------------------------------------------------------------------------------------
DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
TIMER_NUMBERS = DIGITS[2:] + ("ten", "fifteen", "twenty", "thirty", "forty")
OPS = ("plus", "minus", "times")
DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
GREETINGS = ("hello", "hi", "hey")
POLITE_SUFFIX = ("please", "thanks", "thank you")


def digit_string(rng: random.Random, lo: int, hi: int, digits: Sequence[str] = DIGITS) -> str:
    """``lo`` to ``hi`` spoken digits drawn from ``digits``."""
    return " ".join(rng.choice(digits) for _ in range(rng.randint(lo, hi)))


def _core(rng: random.Random) -> str:
    """One core request/answer of a voice-agent turn."""
    k = rng.random()
    if k < 0.22:
        return f"what is {rng.choice(DIGITS)} {rng.choice(OPS)} {rng.choice(DIGITS)}"
    if k < 0.27:
        return f"{rng.choice(DIGITS)} {rng.choice(OPS)} {rng.choice(DIGITS)}"
    if k < 0.34:
        return "what time is it"
    if k < 0.47:
        when = rng.choice(("today", "tomorrow", "today", "tomorrow", *(f"on {d}" for d in DAYS), *DAYS))
        return rng.choice(("what is the weather", "how is the weather")) + f" {when}"
    if k < 0.58:
        n = rng.choice(TIMER_NUMBERS + ("one",))
        return f"set a timer for {n} minute" if n == "one" else f"set a timer for {n} minutes"
    if k < 0.64:
        return rng.choice(
            ("stop", "cancel", "cancel the timer", "stop the timer", "stop please", "cancel that")
        )
    if k < 0.74:
        return rng.choice(("my number is ", "the code is ", "")) + digit_string(rng, 2, 6)
    if k < 0.82:
        return rng.choice(
            ("yes", "no", "yes please", "no thanks", "no thank you", "thank you", "okay", "yes okay")
        )
    if k < 0.88:
        return f"remind me on {rng.choice(DAYS)}" + (
            f" at {rng.choice(DIGITS[1:])}" if rng.random() < 0.5 else ""
        )
    if k < 0.93:
        return rng.choice(
            ("what day is it today", "what day is it tomorrow", f"is it {rng.choice(DAYS)} today")
        )
    return rng.choice(GREETINGS) + (f" {rng.choice(GREETINGS)}" if rng.random() < 0.2 else "")


def compose_sentence(
    rng: random.Random,
    core: Callable[[random.Random], str],
    greetings: Sequence[str],
    conjunction: str,
    suffixes: Sequence[str],
) -> str:
    """One sentence of a language's grammar: optional greeting + one or two cores + optional polite suffix.

    Args:
        rng: The draw.
        core: Draws one request or answer of the language.
        greetings: Greetings that may open the sentence.
        conjunction: The word (with its trailing space) that may join a second core.
        suffixes: Polite endings that may close the sentence.
    """
    parts: list[str] = []
    if rng.random() < 0.25:
        parts.append(rng.choice(greetings))
    parts.append(core(rng))
    if rng.random() < 0.15:
        parts.append(rng.choice((conjunction, "")) + core(rng))
    if rng.random() < 0.2:
        parts.append(rng.choice(suffixes))
    return " ".join(parts)


def sample_sentence(rng: random.Random) -> str:
    """A random English sentence (:func:`compose_sentence` over :func:`_core`)."""
    return compose_sentence(rng, _core, GREETINGS, "and ", POLITE_SUFFIX)


# --------------------------------------------------------------------------------------------------------------
# Cased, punctuated labels (``--labels cased``): how the real Nemotron models write the same words
# --------------------------------------------------------------------------------------------------------------
_D = "(?:" + "|".join(DIGITS) + ")"
_DAY = "(?:" + "|".join(DAYS) + ")"
_N = "(?:" + "|".join(TIMER_NUMBERS + ("one",)) + ")"
#: Every core request of :func:`_core`, as a regular expression over its lower-case words (questions first).
_QUESTION_CORES = (
    rf"what is {_D} (?:plus|minus|times) {_D}",
    r"what time is it",
    rf"(?:what|how) is the weather (?:today|tomorrow|on {_DAY}|{_DAY})",
    r"what day is it (?:today|tomorrow)",
    rf"is it {_DAY} today",
)
_STATEMENT_CORES = (
    rf"{_D} (?:plus|minus|times) {_D}",
    rf"set a timer for {_N} minutes?",
    r"stop the timer|cancel the timer|cancel that|stop please|stop|cancel",
    rf"(?:my number is |the code is )?{_D}(?: {_D})+",
    r"yes okay|yes please|no thanks|no thank you|thank you|yes|no|okay",
    rf"remind me on {_DAY}(?: at {_D})?",
    r"(?:hello|hi|hey)(?: (?:hello|hi|hey))?",
)
_CORE = "(?:" + "|".join(_QUESTION_CORES + _STATEMENT_CORES) + ")"
_QUESTION = re.compile("(?:" + "|".join(_QUESTION_CORES) + ")")
_SENTENCE = re.compile(
    rf"(?:(?P<greet>(?:hello|hi|hey)(?: (?:hello|hi|hey))?) )?(?P<first>{_CORE})"
    rf"(?: (?P<conj>and )?(?P<second>{_CORE}))?(?: (?P<suffix>please|thanks|thank you))?"
)
#: Words written with a capital wherever they stand.
_PROPER = frozenset(DAYS)


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _clause(core: str) -> tuple[str, str]:
    """A core request as written (proper nouns capitalised, a comma after an answer word) and its end mark."""
    words = [w.capitalize() if w in _PROPER else w for w in core.split()]
    if (
        len(words) > 1
        and words[0] in ("yes", "no", "stop")
        and words[1] in ("okay", "please", "thanks", "thank")
    ):
        words[0] += ","
    if len(words) > 1 and words[0] in GREETINGS:
        words[0] += ","
    return " ".join(words), "?" if _QUESTION.fullmatch(core) else "."


def punctuate(text: str) -> str:
    """The cased, punctuated form of an English training sentence (deterministic; words unchanged).

    A leading greeting is a sentence of its own ("Hi. What time is it?"); questions end with ``?`` and everything
    else with ``.``; two requests joined by "and" form one sentence, two without it two sentences; a closing
    "please", "thanks" or "thank you" follows a comma ("What time is it, please?"); days of the week are capitalised.
    A sentence outside the grammar is only capitalised and closed with a full stop.
    """
    m = _SENTENCE.fullmatch(text)
    if m is None:
        return _cap(text) + "."
    out: list[str] = []
    if m["greet"]:
        out.append(_cap(_clause(m["greet"])[0]) + ".")
    first, end = _clause(m["first"])
    if m["second"] is None:
        last = _cap(first)
    elif m["conj"]:
        second, end = _clause(m["second"])
        last = f"{_cap(first)} and {second}"
    else:
        out.append(_cap(first) + end)
        second, end = _clause(m["second"])
        last = _cap(second)
    if m["suffix"]:
        last += f", {m['suffix']}"
    out.append(last + end)
    return " ".join(out)


def heldout_bucket(text: str) -> str:
    """Deterministic split of sentence texts: ``train``, ``val`` (new sentences) or ``test`` (new sentences).

    Only sentences of 3+ words can be held out, so the single words of the vocabulary stay in training.
    """
    if len(text.split()) < 3:
        return "train"
    h = int(hashlib.md5(text.encode()).hexdigest()[:8], 16) % 100
    if h < 4:
        return "val"
    if h < 12:
        return "test"
    return "train"


def vocabulary(sentence: Callable[[random.Random], str] = sample_sentence, draws: int = 200_000) -> list[str]:
    """Every word a sentence generator can produce (for the model card and the tokenizer check).

    Args:
        sentence: The generator (English by default); its labels, as trained on.
        draws: Sentences drawn (enough that every word of the grammar shows up).
    """
    rng = random.Random(0)
    words: set[str] = set()
    for _ in range(draws):
        words.update(sentence(rng).split())
    return sorted(words)


# --------------------------------------------------------------------------------------------------------------
# Synthesis and augmentation
# --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class UttSpec:
    """Everything needed to synthesise one utterance deterministically."""

    name: str
    text: str
    voice: str
    speed: int  # words per minute
    pitch: int  # 0..99
    gap: int  # extra gap between words, units of 10 ms
    seed: int  # numpy seed of the augmentation
    aug: str  # "train" (noise + reverb + filters), "light" (mild noise), "none"
    phonemizer: str = ""  # accent whose spelling rules give the phonemes ("" = the voice reads the text)
    vowel_swap: float = 0.0  # probability that a vowel is replaced by a phonetic neighbour (accent mixing)
    h_drop: float = 0.0  # probability that a word-initial /h/ is dropped (accent mixing)
    warp: float = 1.0  # resampling factor applied after synthesis: scales formants, pitch and tempo together


def phonemize(text: str, accent: str) -> str:
    """espeak-ng phoneme mnemonics of ``text`` by ``accent``'s spelling rules, one line."""
    out = subprocess.run(
        ["espeak-ng", "-q", "-x", "-v", accent, text], check=True, capture_output=True, text=True
    )
    return " ".join(out.stdout.split())


_VOWELS_LONGEST_FIRST = sorted(VOWEL_NEIGHBOURS, key=len, reverse=True)


def perturb_phonemes(phonemes: str, rng: random.Random, vowel_swap: float, h_drop: float) -> str:
    """Swap vowels for phonetic neighbours and drop word-initial /h/, as accents differ.

    Mnemonics are matched longest first at each position; stress marks and consonants are kept. A vowel followed
    by a length or colour mark that makes it another phoneme (``a#``, ``aI@``, ``0@``) is left alone.
    """
    words = []
    for word in phonemes.split(" "):
        i = 0
        out: list[str] = []
        start = True  # before the first phoneme of the word (stress marks do not count)
        while i < len(word):
            ch = word[i]
            if ch in "',":
                out.append(ch)
                i += 1
                continue
            if start and ch == "h" and rng.random() < h_drop:
                i += 1
                start = False
                continue
            start = False
            for v in _VOWELS_LONGEST_FIRST:
                nxt = word[i + len(v) : i + len(v) + 1]
                if word.startswith(v, i) and nxt not in ("#", "@", ":", "2", "3", "L"):
                    out.append(rng.choice(VOWEL_NEIGHBOURS[v]) if rng.random() < vowel_swap else v)
                    i += len(v)
                    break
            else:
                out.append(ch)
                i += 1
        words.append("".join(out))
    return " ".join(w for w in words if w)


def synth_raw(
    text: str, voice: str, speed: int, pitch: int, gap: int, warp: float = 1.0, phonemes: bool = False
) -> np.ndarray:
    """espeak-ng → sox (no dither; optional resampling warp) → 16 kHz mono int16 samples.

    Args:
        text: words, or espeak-ng phoneme mnemonics when ``phonemes`` is true.
        voice: espeak-ng voice, ``accent[+variant]``.
        speed: words per minute.
        pitch: 0..99.
        gap: extra pause between words, units of 10 ms.
        warp: ``sox speed`` factor (1.1 = formants, pitch and tempo all 10% higher).
        phonemes: speak ``text`` as phoneme input (``[[...]]``).
    """
    espeak = subprocess.run(
        [
            "espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "-g", str(gap), "--stdout",
            f"[[{text}]]" if phonemes else text,
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    effects = ["speed", f"{warp:.4f}", "rate", "-h", str(MODEL_SAMPLE_RATE)] if warp != 1.0 else []
    sox = subprocess.run(
        [
            "sox",
            "-D",
            "-t",
            "wav",
            "-",
            "-r",
            str(MODEL_SAMPLE_RATE),
            "-c",
            "1",
            "-b",
            "16",
            "-e",
            "signed",
            "-t",
            "raw",
            "-",
            *effects,
        ],
        input=espeak.stdout,
        check=True,
        capture_output=True,
    )
    return np.frombuffer(sox.stdout, dtype=np.int16)


def _trim(x: np.ndarray, thresh: float = 1e-3) -> np.ndarray:
    idx = np.flatnonzero(np.abs(x) > thresh)
    if idx.size == 0:
        return x
    return x[max(0, idx[0] - 160) : idx[-1] + 160]


def augment(x16: np.ndarray, seed: int, kind: str) -> np.ndarray:
    """Deterministic augmentation: silence padding, gain, reverb, coloured noise, band-limiting."""
    from scipy.signal import lfilter

    rng = np.random.default_rng(seed)
    x = _trim(x16.astype(np.float64) / 32768.0)
    sr = MODEL_SAMPLE_RATE
    if kind == "train":
        if rng.random() < 0.3:  # synthetic room: exponentially decaying noise impulse response
            rt60 = rng.uniform(0.1, 0.5)
            n = int(rt60 * sr)
            t = np.arange(n) / sr
            ir = rng.standard_normal(n) * np.exp(-6.9 * t / rt60)
            ir[0] = 0.0
            ir /= np.sqrt(np.sum(ir**2)) + 1e-9
            wet = np.convolve(x, ir)[: x.size + n // 2]
            x = np.pad(x, (0, wet.size - x.size)) + rng.uniform(0.1, 0.4) * wet
        if rng.random() < 0.2:  # band-limit (cheap microphone / telephone-ish)
            a = rng.uniform(0.3, 0.7)
            x = lfilter([1 - a], [1, -a], x)
        if rng.random() < 0.2:  # high-pass
            x = lfilter([1, -1], [1, -rng.uniform(0.9, 0.99)], x)
    lead, tail = rng.uniform(0.05, 0.35), rng.uniform(0.1, 0.4)
    x = np.concatenate([np.zeros(int(lead * sr)), x, np.zeros(int(tail * sr))])
    peak = np.max(np.abs(x)) + 1e-9
    x = x / peak * 10 ** (rng.uniform(-18.0, -1.0) / 20)
    p_noise, snr_lo, snr_hi = {
        "train": (0.7, 8.0, 35.0),
        "light": (0.5, 25.0, 40.0),
        "none": (0.0, 0.0, 0.0),
    }[kind]
    if rng.random() < p_noise:
        white = rng.standard_normal(x.size)
        colour = rng.choice(["white", "pink", "brown"])
        if colour == "pink":
            noise = lfilter(
                [0.049922, -0.095993, 0.050612, -0.004408], [1, -2.494956, 2.017265, -0.522189], white
            )
        elif colour == "brown":
            noise = lfilter([1.0], [1, -0.98], white)
        else:
            noise = white
        p_sig = np.mean(x**2) + 1e-12
        snr = rng.uniform(snr_lo, snr_hi)
        noise *= np.sqrt(p_sig / (10 ** (snr / 10)) / (np.mean(noise**2) + 1e-12))
        x = x + noise
    peak = np.max(np.abs(x))
    if peak > 0.99:
        x *= 0.99 / peak
    return np.round(x * 32767).astype(np.int16)


def write_wav(path: Path, samples: np.ndarray) -> None:
    """Write 16 kHz mono int16 PCM wav (byte-identical for identical samples)."""
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(MODEL_SAMPLE_RATE)
        w.writeframes(samples.astype("<i2").tobytes())


def render(spec: UttSpec) -> np.ndarray:
    """Synthesise and augment one utterance."""
    if spec.phonemizer:
        rng = random.Random(spec.seed ^ 0x5EED)
        ph = perturb_phonemes(phonemize(spec.text, spec.phonemizer), rng, spec.vowel_swap, spec.h_drop)
        raw = synth_raw(ph, spec.voice, spec.speed, spec.pitch, spec.gap, spec.warp, phonemes=True)
    else:
        raw = synth_raw(spec.text, spec.voice, spec.speed, spec.pitch, spec.gap, spec.warp)
    return augment(raw, spec.seed, spec.aug)


def _render_to(args: tuple[UttSpec, str]) -> dict[str, Any]:
    spec, out_dir = args
    x = render(spec)
    path = Path(out_dir) / f"{spec.name}.wav"
    write_wav(path, x)
    return {
        "audio_filepath": str(path),
        "duration": round(x.size / MODEL_SAMPLE_RATE, 4),
        "text": spec.text,
        "voice": spec.voice,
    }


def make_specs(
    rng: random.Random,
    n: int,
    split: str,
    prefix: str,
    bases: Sequence[str],
    variants: Sequence[str],
    aug: str,
    sentence: Callable[[random.Random], str] = sample_sentence,
    label: Callable[[str], str] = str,
    max_words: int | None = None,
) -> list[UttSpec]:
    """Draw ``n`` utterance specs whose sentences fall in ``split`` (see :func:`heldout_bucket`).

    Args:
        rng: The draw.
        n: Specs wanted.
        split: ``train``, ``val`` or ``test``: the :func:`heldout_bucket` of each sentence's label.
        prefix: Name prefix (names are ``{prefix}_{index:06d}``).
        bases: espeak-ng voices to draw from.
        variants: espeak-ng voice variants to draw from (``""`` for none).
        aug: The augmentation kind of every spec.
        sentence: The sentence generator (English by default); specs keep its spoken text.
        label: The training label of a spoken sentence (identity for English).
        max_words: Longer sentences are skipped (None: no limit).
    """
    specs: list[UttSpec] = []
    while len(specs) < n:
        text = sentence(rng)
        if heldout_bucket(label(text)) != split or (max_words is not None and len(text.split()) > max_words):
            continue
        base, var = rng.choice(bases), rng.choice(variants)
        voice = f"{base}+{var}" if var else base
        specs.append(
            UttSpec(
                name=f"{prefix}_{len(specs):06d}",
                text=text,
                voice=voice,
                speed=rng.randint(125, 250),
                pitch=rng.randint(15, 85),
                gap=rng.choice((0, 0, 0, 0, 1, 2, 3, 5, 8)),
                seed=rng.randrange(2**31),
                aug=aug,
            )
        )
    return specs


def make_unseen_specs(rng: random.Random, n: int, split: str, prefix: str, aug: str) -> list[UttSpec]:
    """Specs for voices never used in training: half unseen base accent, half unseen variants on any base."""
    half = n // 2
    a = make_specs(rng, half, split, prefix, UNSEEN_BASES, ("",) + TRAIN_VARIANTS + UNSEEN_VARIANTS, aug)
    b = make_specs(rng, n - half, split, prefix, TRAIN_BASES + UNSEEN_BASES, UNSEEN_VARIANTS, aug)
    specs = a + [UttSpec(**{**asdict(s), "name": f"{prefix}_{half + i:06d}"}) for i, s in enumerate(b)]
    return specs


def render_set(specs: Sequence[UttSpec], out_dir: Path, manifest: Path, workers: int) -> list[dict[str, Any]]:
    """Render specs to wavs in ``out_dir`` and write a NeMo JSON-lines manifest."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        rows = list(pool.map(_render_to, [(s, str(out_dir)) for s in specs], chunksize=64))
    with manifest.open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    hours = sum(r["duration"] for r in rows) / 3600
    print(f"[data] {manifest.name}: {len(rows)} utterances, {hours:.2f} h", flush=True)
    return rows


def stage_data(args: argparse.Namespace) -> None:
    """Synthesise train, validation and held-out test sets."""
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    train = make_specs(rng, args.n_train, "train", "train", TRAIN_BASES, TRAIN_VARIANTS, "train")
    val = make_specs(rng, args.n_val, "val", "val", TRAIN_BASES, TRAIN_VARIANTS, "light")
    render_set(train, DATA_DIR / "train", DATA_DIR / "train_manifest.json", args.workers)
    render_set(val, DATA_DIR / "val", DATA_DIR / "val_manifest.json", args.workers)
    stage_heldout_full(args)
    (DATA_DIR / "voices.json").write_text(
        json.dumps(
            {
                "train_bases": TRAIN_BASES,
                "train_variants": TRAIN_VARIANTS,
                "unseen_bases": UNSEEN_BASES,
                "unseen_variants": UNSEEN_VARIANTS,
            },
            indent=1,
        )
    )


def make_accent_specs(rng: random.Random, n: int, prefix: str) -> list[UttSpec]:
    """Accent-mix training specs: training sentences and accents only, phonemes of one accent spoken by another
    (or the same) with perturbed vowels, dropped /h/ and a resampling warp; full training augmentation."""
    specs: list[UttSpec] = []
    variants = TRAIN_VARIANTS + EXTRA_TRAIN_VARIANTS
    while len(specs) < n:
        text = sample_sentence(rng)
        if heldout_bucket(text) != "train":
            continue
        base, var = rng.choice(TRAIN_BASES), rng.choice(variants)
        specs.append(
            UttSpec(
                name=f"{prefix}_{len(specs):06d}",
                text=text,
                voice=f"{base}+{var}" if var else base,
                speed=rng.randint(125, 250),
                pitch=rng.randint(15, 85),
                gap=rng.choice((0, 0, 0, 0, 1, 2, 3, 5, 8)),
                seed=rng.randrange(2**31),
                aug="train",
                phonemizer=rng.choice(TRAIN_BASES),
                vowel_swap=rng.choice((0.0, 0.05, 0.1, 0.15)),
                h_drop=rng.choice((0.0, 0.0, 0.5, 1.0)),
                warp=round(rng.uniform(0.88, 1.12), 3) if rng.random() < 0.7 else 1.0,
            )
        )
    return specs


def stage_accents(args: argparse.Namespace) -> None:
    """Accent-mix training set (``train_accents``) and the mixed manifest ``train_mix_manifest.json``
    (the plain training set followed by it), for training with ``--train-manifest train_mix_manifest.json``."""
    rng = random.Random(args.seed + 3)
    specs = make_accent_specs(rng, args.n_accents, "accent")
    render_set(specs, DATA_DIR / "train_accents", DATA_DIR / "train_accents_manifest.json", args.workers)
    join_manifests("train_mix_manifest.json", "train_manifest.json", "train_accents_manifest.json")


def join_manifests(out: str, *parts: str) -> None:
    """Write ``data/tiny_asr/<out>``: the JSON-lines manifests ``parts`` (under data/tiny_asr/) one after another."""
    text = "".join((DATA_DIR / name).read_text() for name in parts)
    (DATA_DIR / out).write_text(text)
    print(f"[data] {out}: {text.count(chr(10))} utterances ({' + '.join(parts)})", flush=True)


def joined_row(path: Path, x: np.ndarray, parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The manifest row of a multi-turn clip ``x`` (int16, 16 kHz) written at ``path``, joined from ``parts``'
    rows: their texts joined, and each kept in ``parts`` (the cased labels punctuate each turn on its own)."""
    return {
        "audio_filepath": str(path),
        "duration": round(x.size / MODEL_SAMPLE_RATE, 4),
        "text": " ".join(r["text"] for r in parts),
        "voice": "|".join(r["voice"] for r in parts),
        "parts": [r["text"] for r in parts],
    }


def stage_sessions(args: argparse.Namespace) -> None:
    """Multi-turn training clips (``train_sessions``): two training utterances of at most 3.5 s each joined by a
    0.2-1.5 s pause (the pure-PyTorch RNNT loss costs O(T x U) Python-level steps, so longer clips slow training).

    A model trained on single utterances learns that speech ends after one sentence: fed a session (a stream
    that keeps its caches and decoder state across turns, or a long clip) it drops every sentence after the
    first. The mixed manifest ``train_all_manifest.json`` is ``train_mix`` followed by these clips.
    """
    rng = random.Random(args.seed + 4)
    rows = [json.loads(line) for line in (DATA_DIR / "train_mix_manifest.json").open()]
    rows = [r for r in rows if r["duration"] <= 3.5]
    out_dir = DATA_DIR / "train_sessions"
    out_dir.mkdir(parents=True, exist_ok=True)
    with (DATA_DIR / "train_sessions_manifest.json").open("w") as f:
        for i in range(args.n_sessions):
            parts = rng.sample(rows, 2)
            pause = np.zeros(int(rng.uniform(0.2, 1.5) * MODEL_SAMPLE_RATE), np.int16)
            first, second = (read_pcm16(Path(r["audio_filepath"])) for r in parts)
            x = np.concatenate([first, pause, second])
            path = out_dir / f"session_{i:06d}.wav"
            write_wav(path, x)
            f.write(json.dumps(joined_row(path, x, parts)) + "\n")
    join_manifests("train_all_manifest.json", "train_mix_manifest.json", "train_sessions_manifest.json")


def stage_turns(args: argparse.Namespace) -> None:
    """Longer multi-turn training clips (``train_turns``): 2-3 training utterances of at most 3 s each, each
    followed by a 0.3-3.0 s pause (the silence of a live session between an end of turn and the next words).

    A live stream keeps its encoder caches and decoder state across turns (soft finalize) and hears 2-4 s of
    silence between them; the ``sessions`` clips (two turns, 0.2-1.5 s apart) cover only the short end. Each
    part keeps its own spoken text (``parts``), so the cased labels close every turn's sentence. The mixed
    manifest ``train_turns_all_manifest.json`` is ``train_lead_all`` followed by these clips.
    """
    rng = random.Random(args.seed + 6)
    rows = [json.loads(line) for line in (DATA_DIR / "train_mix_manifest.json").open()]
    rows = [r for r in rows if r["duration"] <= 3.0]
    out_dir = DATA_DIR / "train_turns"
    out_dir.mkdir(parents=True, exist_ok=True)
    with (DATA_DIR / "train_turns_manifest.json").open("w") as f:
        for i in range(args.n_turns):
            parts = rng.sample(rows, rng.choice((2, 2, 3)))
            pieces = []
            for r in parts:
                pieces.append(read_pcm16(Path(r["audio_filepath"])))
                pieces.append(np.zeros(int(rng.uniform(0.3, 3.0) * MODEL_SAMPLE_RATE), np.int16))
            x = np.concatenate(pieces)
            path = out_dir / f"turns_{i:06d}.wav"
            write_wav(path, x)
            f.write(json.dumps(joined_row(path, x, parts)) + "\n")
    join_manifests("train_turns_all_manifest.json", "train_lead_all_manifest.json", "train_turns_manifest.json")


def word_gaps(x: np.ndarray, window: int = 160, min_windows: int = 3) -> list[int]:
    """Samples at the middle of each quiet run of at least ``min_windows`` (10 ms windows under a tenth of the
    clip's loud level) between the first and last loud window of ``x``: the gaps between its words (and some
    stop closures inside them, which a pause may also split)."""
    n = x.size // window
    rms = np.sqrt((x[: n * window].astype(np.float64) ** 2).reshape(n, window).mean(axis=1))
    quiet = rms < 0.1 * np.percentile(rms, 95)
    loud = np.flatnonzero(~quiet)
    if loud.size < 2:
        return []
    gaps, start = [], None
    for i in range(int(loud[0]), int(loud[-1]) + 1):
        if quiet[i] and start is None:
            start = i
        elif not quiet[i] and start is not None:
            if i - start >= min_windows:
                gaps.append((start + i) // 2 * window + window // 2)
            start = None
    return gaps


def stage_paused(args: argparse.Namespace) -> None:
    """Training clips with a pause inside a sentence (``train_paused``): a training utterance of at most 4 s with
    0.3-1.0 s of silence inserted at one of its word gaps, its label unchanged.

    Users pause inside sentences ("set a timer for ... six minutes") for longer than a VAD's stop. A punctuating
    model that heard pauses only between sentences (the multi-turn clips) writes a full stop at every pause,
    which the turn-end rules then read as a finished sentence. The mixed manifest ``train_paused_all_manifest.json``
    is ``train_turns_all`` followed by these clips.
    """
    rng = random.Random(args.seed + 7)
    rows = [json.loads(line) for line in (DATA_DIR / "train_manifest.json").open()]
    rows = [r for r in rows if r["duration"] <= 4.0 and len(r["text"].split()) >= 3]
    out_dir = DATA_DIR / "train_paused"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = 0
    with (DATA_DIR / "train_paused_manifest.json").open("w") as f:
        while written < args.n_paused:
            r = rng.choice(rows)
            x = read_pcm16(Path(r["audio_filepath"]))
            gaps = word_gaps(x)
            if not gaps:
                continue
            at = rng.choice(gaps)
            x = np.concatenate([x[:at], np.zeros(int(rng.uniform(0.3, 1.0) * MODEL_SAMPLE_RATE), np.int16), x[at:]])
            path = out_dir / f"paused_{written:06d}.wav"
            write_wav(path, x)
            f.write(json.dumps({**r, "audio_filepath": str(path), "duration": round(x.size / MODEL_SAMPLE_RATE, 4)}) + "\n")
            written += 1
    join_manifests("train_paused_all_manifest.json", "train_turns_all_manifest.json", "train_paused_manifest.json")


def stage_silences(args: argparse.Namespace) -> None:
    """Training clips that start after a long silence (``train_lead``): a training or accent-mix utterance of at
    most 4 s after 0-5 s (uniform) of silence, half of it digital zeros and half the clip's own noise floor.

    The utterances of the other sets start after 0.05-0.35 s; a model that never saw more drops or garbles the
    first words when a user starts speaking after a pause (the silence between turns of a live session). The
    mixed manifest ``train_lead_all_manifest.json`` is ``train_all`` followed by these clips.
    """
    rng = random.Random(args.seed + 5)
    rows = [json.loads(line) for line in (DATA_DIR / "train_mix_manifest.json").open()]
    rows = [r for r in rows if r["duration"] <= 4.0]
    out_dir = DATA_DIR / "train_lead"
    out_dir.mkdir(parents=True, exist_ok=True)
    with (DATA_DIR / "train_lead_manifest.json").open("w") as f:
        for i in range(args.n_lead):
            r = rng.choice(rows)
            x = read_pcm16(Path(r["audio_filepath"]))
            n = int(rng.uniform(0.0, args.max_lead_s) * MODEL_SAMPLE_RATE)
            if rng.random() < 0.5:
                lead = np.zeros(n, np.int16)
            else:  # white noise at the level of the clip's first 40 ms (its lead-in: silence plus its noise)
                rms = float(np.sqrt(np.mean(x[:640].astype(np.float64) ** 2)))
                noise = np.random.default_rng(rng.randrange(2**31)).standard_normal(n) * rms
                lead = np.clip(np.round(noise), -32768, 32767).astype(np.int16)
            x = np.concatenate([lead, x])
            path = out_dir / f"lead_{i:06d}.wav"
            write_wav(path, x)
            row = {**r, "audio_filepath": str(path), "duration": round(x.size / MODEL_SAMPLE_RATE, 4)}
            f.write(json.dumps(row) + "\n")
    join_manifests("train_lead_all_manifest.json", "train_all_manifest.json", "train_lead_manifest.json")


def cased_label(row: dict[str, Any]) -> str:
    """The cased, punctuated label of a manifest row: its spoken text punctuated, or, for a multi-turn clip
    (``parts``: each turn's spoken text), each turn punctuated on its own ("Stop, please. What time is it?")."""
    if "parts" in row:
        return " ".join(punctuate(part) for part in row["parts"])
    return punctuate(row.get("spoken", row["text"]))


def stage_cased(args: argparse.Namespace) -> None:
    """Cased, punctuated copies of every manifest under data/tiny_asr/: ``<name>_cased_manifest.json`` with the
    label :func:`punctuate` of the spoken text (kept as ``spoken``). Train with ``--labels cased``."""
    for path in sorted(DATA_DIR.glob("*_manifest.json")):
        if path.name.endswith("_cased_manifest.json"):
            continue
        out = DATA_DIR / path.name.replace("_manifest.json", "_cased_manifest.json")
        with path.open() as src, out.open("w") as dst:
            for line in src:
                row = json.loads(line)
                spoken = row.get("spoken", row["text"])
                dst.write(json.dumps({**row, "text": cased_label(row), "spoken": spoken}) + "\n")
        print(f"[cased] {out.name}", flush=True)


def stage_heldout_full(args: argparse.Namespace) -> None:
    """Full held-out test sets (new sentences; training voices / unseen voices) for the model card."""
    rng = random.Random(args.seed + 1)
    seen = make_specs(rng, args.n_test, "test", "seen", TRAIN_BASES, TRAIN_VARIANTS, "light")
    unseen = make_unseen_specs(rng, args.n_test, "test", "unseen", "light")
    render_set(seen, DATA_DIR / "test_seen_voice", DATA_DIR / "test_seen_voice_manifest.json", args.workers)
    render_set(
        unseen, DATA_DIR / "test_unseen_voice", DATA_DIR / "test_unseen_voice_manifest.json", args.workers
    )


# --------------------------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------------------------
def labelled(manifest: str, args: argparse.Namespace) -> str:
    """The name of ``manifest`` (under data/tiny_asr/) with ``--labels``'s labels (see the ``cased`` stage)."""
    return manifest.replace("_manifest.json", "_cased_manifest.json") if args.labels == "cased" else manifest


def tokenizer_dir(args: argparse.Namespace) -> Path:
    """Where the tokenizer of ``--labels``'s labels lives."""
    if args.tokenizer_dir:
        return DATA_DIR / args.tokenizer_dir
    return DATA_DIR / ("tokenizer_cased" if args.labels == "cased" else "tokenizer")


def stage_tokenizer(args: argparse.Namespace) -> None:
    """Train a SentencePiece BPE tokenizer (NeMo layout: tokenizer.model, tokenizer.vocab, vocab.txt)."""
    import sentencepiece as spm

    out = tokenizer_dir(args)
    out.mkdir(parents=True, exist_ok=True)
    texts = [json.loads(line)["text"] for line in (DATA_DIR / labelled("train_manifest.json", args)).open()]
    corpus = out / "train_text.txt"
    corpus.write_text("\n".join(texts) + "\n")
    spm.SentencePieceTrainer.Train(
        input=str(corpus),
        model_prefix=str(out / "tokenizer"),
        vocab_size=args.vocab_size,
        model_type="bpe",
        character_coverage=1.0,
        hard_vocab_limit=False,
        shuffle_input_sentence=False,
        bos_id=-1,
        eos_id=-1,
        remove_extra_whitespaces=False,
        num_threads=1,
        minloglevel=2,
    )
    pieces = [line.split("\t")[0] for line in (out / "tokenizer.vocab").open(encoding="utf8")]
    tokens = []
    for p in pieces:
        if p in ("<s>", "</s>", "<pad>", "<unk>"):
            continue
        t = p[1:] if p.startswith("▁") else f"##{p}"
        tokens.append(t if t else p[0])
    (out / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf8")
    print(f"[tokenizer] {len(pieces)} pieces -> {out}", flush=True)


# --------------------------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------------------------
#: The lookaheads trained jointly, ``[left, right]`` in 80 ms encoder frames, one per latency mode; the first
#: (the 160 ms mode: [70, 1]) is the model's default.
ATT_CONTEXT_SIZE = [[LEFT_CONTEXT_FRAMES, LATENCY_MODES[ms]] for ms in (160, 80, 560, 1120)]


def model_config(args: argparse.Namespace, tokenizer_dir: Path) -> dict[str, Any]:
    """The training config: the package's architecture (:func:`asr_model_config`) at the sizes of ``args``, with
    dropout and dither, plus what training adds (datasets, SpecAugment, the CTC head, optimiser settings)."""
    from pipecat_nemotron.asr.architectures import FastConformerSize, asr_model_config

    size = FastConformerSize(
        features=80,
        n_layers=args.n_layers,
        d_model=args.d_model,
        n_heads=4,
        conv_kernel=9,
        sub_channels=args.subsampling_channels,
        pred_hidden=args.pred_hidden,
        joint_hidden=args.pred_hidden,
    )
    cfg = asr_model_config(
        str(tokenizer_dir), size, att_context_sizes=ATT_CONTEXT_SIZE, dropout=0.1, dither=1.0e-05
    )
    cfg["joint"]["fused_batch_size"] = args.batch_size
    cfg["decoding"]["greedy"]["use_cuda_graph_decoder"] = False
    # No NeMo scheduler: the learning rate is set every step by StepOrClockCosine (see stage_train).
    cfg["optim"].update(lr=args.lr, betas=[0.9, 0.98], weight_decay=1e-3)
    return {**cfg, **_training_config(args)}


def _training_config(args: argparse.Namespace) -> dict[str, Any]:
    """What a training config adds to the architecture: logging switches, datasets, SpecAugment, the CTC head."""
    ds = {
        "sample_rate": MODEL_SAMPLE_RATE,
        "batch_size": args.batch_size,
        "num_workers": args.num_workers,
        "pin_memory": False,
        "use_start_end_token": False,
        "trim_silence": False,
        "max_duration": 20.0,
        "min_duration": 0.1,
        "drop_last": False,
    }
    return {
        "log_prediction": False,
        "compute_eval_loss": False,
        "skip_nan_grad": False,
        "train_ds": {
            **ds,
            "manifest_filepath": str(DATA_DIR / args.train_manifest),
            "shuffle": True,
            "use_semi_sorted_batching": True,
            "randomization_factor": 0.1,
            "semi_sort_sampler_seed": args.seed,
        },
        "validation_ds": {
            **ds,
            "manifest_filepath": str(DATA_DIR / labelled(args.val_manifest, args)),
            "shuffle": False,
        },
        "test_ds": {**ds, "manifest_filepath": None, "shuffle": False},
        "spec_augment": {
            "_target_": "nemo.collections.asr.modules.SpectrogramAugmentation",
            "freq_masks": 2,
            "time_masks": 2,
            "freq_width": 12,
            "time_width": 0.05,
        }
        if args.spec_augment
        else None,
        "aux_ctc": {
            "ctc_loss_weight": args.ctc_weight,
            "use_cer": False,
            "ctc_reduction": "mean_batch",
            "decoder": {
                "_target_": "nemo.collections.asr.modules.ConvASRDecoder",
                "feat_in": None,
                "num_classes": -1,
                "vocabulary": [],
            },
            "decoding": {"strategy": "greedy_batch"},
        },
    }


def build_model(args: argparse.Namespace, trainer: Any = None) -> Any:
    """Build the hybrid RNNT+CTC model from :func:`model_config`."""
    from nemo.collections.asr.models import EncDecHybridRNNTCTCBPEModel
    from omegaconf import OmegaConf

    from pipecat_nemotron.asr.loading import quiet_nemo

    cfg = OmegaConf.create(model_config(args, tokenizer_dir(args)))
    with quiet_nemo(logging.WARNING):
        model = EncDecHybridRNNTCTCBPEModel(cfg=cfg, trainer=trainer)
    return model


class Progress:
    """Prints one line per ``every`` steps (loss, lr, seconds per step) and one per validation to stdout.

    A Lightning callback once made one by :func:`lightning_callback` (Lightning is imported only to train).
    """

    def __init__(self, every: int) -> None:
        self.every = every
        self.t0 = time.perf_counter()
        self.last = self.t0

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step % self.every == 0:
            now = time.perf_counter()
            loss = float(outputs["loss"]) if isinstance(outputs, dict) else float("nan")
            lr = trainer.optimizers[0].param_groups[0]["lr"]
            print(
                f"[train] step {step} loss {loss:.3f} lr {lr:.2e} "
                f"{(now - self.last) / self.every:.2f} s/step elapsed {(now - self.t0) / 60:.1f} min",
                flush=True,
            )
            self.last = now

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        m = {k: round(float(v), 4) for k, v in trainer.callback_metrics.items() if k.startswith("val")}
        print(
            f"[val] step {trainer.global_step} {m} elapsed {(time.perf_counter() - self.t0) / 60:.1f} min",
            flush=True,
        )


class StepOrClockCosine:
    """Linear warm-up, then cosine decay over ``max(step / max_steps, elapsed / max_seconds)``.

    On an idle machine the schedule is step-driven (reproducible); on a shared, slower machine the wall clock
    takes over so that the decay still completes within the time budget. Training stops at progress 1. A
    Lightning callback once made one by :func:`lightning_callback`.

    Args:
        peak: Learning rate after the warm-up.
        floor: Learning rate at the end of the decay.
        warmup: Warm-up steps.
        max_steps: Steps of the whole schedule.
        max_seconds: Wall-clock budget of the whole schedule, s.
        stop_step: Stop at this step (0: at the end of the schedule).
        elapsed_s: Seconds an interrupted run had already trained (a resumed run continues its clock).

    """

    def __init__(
        self,
        peak: float,
        floor: float,
        warmup: int,
        max_steps: int,
        max_seconds: float,
        stop_step: int,
        elapsed_s: float = 0.0,
    ) -> None:
        self.peak, self.floor, self.warmup = peak, floor, warmup
        self.max_steps, self.max_seconds, self.stop_step = max_steps, max_seconds, stop_step
        self.elapsed_s = elapsed_s
        self.t0 = time.perf_counter()
        self.clock_driven = False

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.t0 = time.perf_counter() - self.elapsed_s

    def state_dict(self) -> dict[str, float]:
        """The schedule's clock, s trained so far: kept in every checkpoint, so ``--resume`` continues it."""
        return {"elapsed_s": time.perf_counter() - self.t0}

    def load_state_dict(self, state_dict: dict[str, float]) -> None:
        """Continue the clock of the checkpoint a resumed run starts from (``--elapsed-minutes`` overrides)."""
        if not self.elapsed_s:
            self.elapsed_s = float(state_dict.get("elapsed_s", 0.0))

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        by_step = step / self.max_steps
        by_clock = (time.perf_counter() - self.t0) / self.max_seconds
        progress = min(1.0, max(by_step, by_clock))
        if step > 0 and by_clock > by_step and not self.clock_driven:
            self.clock_driven = True
            print(f"[train] step {step}: wall clock now drives the schedule", flush=True)
        lr = self.floor + (self.peak - self.floor) * 0.5 * (1 + math.cos(math.pi * progress))
        lr *= min(1.0, (step + 1) / self.warmup)
        for opt in trainer.optimizers:
            for group in opt.param_groups:
                group["lr"] = lr
        if progress >= 1.0 or (self.stop_step and step >= self.stop_step):
            trainer.should_stop = True


class FastRNNTLoss:
    """The RNNT loss of NeMo's ``RNNTLossPytorch`` (same inputs, same values), vectorised over the label axis.

    NeMo's pure-PyTorch loss fills its alpha lattice one ``(t, u)`` cell at a time, and each cell's backward
    allocates a gradient the size of the whole joint output: the cost grows with ``(T x U)^2`` (a 2 s clip with
    punctuated labels took minutes per batch on a busy 2-core CPU). Here each time step is one vectorised update:
    ``alpha[t, u] = E[u] + logcumsumexp_k<=u(alpha[t-1, k] + blank[t-1, k] - E[k])`` with ``E`` the cumulative
    label log-probabilities at step ``t``, so a batch costs ``T`` small tensor operations. A ``torch.nn.Module``
    once made by :func:`fast_rnnt_loss_module`.

    Args:
        blank: Index of the blank token (the last one in NeMo).

    """

    def __init__(self, blank: int) -> None:
        super().__init__()
        self.blank = blank
        self.reduction: str | None = None

    def forward(self, acts: Any, labels: Any, act_lens: Any, label_lens: Any) -> Any:
        """Per-utterance negative log-likelihoods, shape ``(B,)`` (NeMo's wrapper reduces them)."""
        import torch

        acts = torch.log_softmax(acts.float(), -1)
        b, t_max, u_max, _ = acts.shape  # u_max = longest label + 1
        blank = acts[..., self.blank]  # (B, T, U)
        emit = torch.gather(acts[:, :, :-1, :], 3, labels[:, None, : u_max - 1, None].expand(b, t_max, -1, 1))
        emit = emit.squeeze(3)  # (B, T, U-1): log-prob of label u at (t, u)
        zero = acts.new_zeros(b, t_max, 1)
        cum = torch.cat([zero, emit.cumsum(2)], 2)  # (B, T, U): E[t, u] = sum_{j<u} emit[t, j]
        alphas = []
        alpha = cum[:, 0]  # t = 0: labels only
        alphas.append(alpha)
        for t in range(1, t_max):
            stay = alpha + blank[:, t - 1]
            alpha = cum[:, t] + torch.logcumsumexp(stay - cum[:, t], 1)
            alphas.append(alpha)
        lattice = torch.stack(alphas, 1)  # (B, T, U)
        idx_t = (act_lens - 1).long()
        idx_u = label_lens.long()
        rows = torch.arange(b, device=acts.device)
        return -(lattice[rows, idx_t, idx_u] + blank[rows, idx_t, idx_u])


def fast_rnnt_loss_module(blank: int) -> Any:
    """A :class:`FastRNNTLoss` as a ``torch.nn.Module``."""
    import torch

    cls = type("FastRNNTLoss", (FastRNNTLoss, torch.nn.Module), {"__call__": torch.nn.Module.__call__})
    return cls(blank)


def lightning_callback(cls: type) -> type:
    """``cls`` as a Lightning ``Callback`` (its hooks override the base class's no-ops)."""
    from lightning.pytorch.callbacks import Callback

    return type(cls.__name__, (cls, Callback), {})


def _trainer(args: argparse.Namespace, run_dir: Path, callbacks: list[Any]) -> Any:
    """The CPU Lightning trainer of one run (validation every ``--val-every`` steps, CSV logs under ``run_dir``)."""
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import CSVLogger

    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=args.max_steps,
        max_time={"minutes": args.max_minutes + 10},  # backstop; the schedule stops training at max_minutes
        val_check_interval=min(args.val_every, args.max_steps),
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        log_every_n_steps=25,
        gradient_clip_val=1.0,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=CSVLogger(str(run_dir), name="logs"),
        callbacks=callbacks,
        deterministic=False,
    )


def _training_model(args: argparse.Namespace, trainer: Any) -> Any:
    """The model with its data and optimiser set up (from ``--init-from``'s weights if given)."""
    import torch

    from pipecat_nemotron.asr.loading import quiet_nemo

    model = build_model(args, trainer=trainer)
    if args.init_from:
        state = torch.load(args.init_from, map_location="cpu", weights_only=False)["state_dict"]
        model.load_state_dict(state)
        print(f"[train] initialised from {args.init_from}", flush=True)
    elif args.init_from_nemo:
        init_from_other_vocabulary(model, Path(args.init_from_nemo))
    if args.fast_rnnt_loss:
        model.loss._loss = fast_rnnt_loss_module(model.loss._loss.blank)
    with quiet_nemo(logging.WARNING):
        model.setup_training_data(model.cfg.train_ds)
        model.setup_validation_data(model.cfg.validation_ds)
        model.setup_optimization(model.cfg.optim)
    return model


#: SentencePiece's word-start mark.
WORD_MARK = "\u2581"
#: New marker pieces and the old piece whose rows (output, embedding) they start from: ``<EOU>`` ends an
#: utterance where the cased model writes its end mark, so it starts as a copy of the full stop.
MARKER_ROWS: dict[str, str] = {"<EOU>": "."}
#: Parameters with one row per output token (blank last) of the hybrid RNNT+CTC model.
_TOKEN_ROWS = (
    "decoder.prediction.embed.weight",
    "joint.joint_net.2.weight",
    "joint.joint_net.2.bias",
    "ctc_decoder.decoder_layers.0.weight",
    "ctc_decoder.decoder_layers.0.bias",
)


def init_from_other_vocabulary(model: Any, source: Path) -> None:
    """Copy a trained ``.nemo`` model's weights into ``model``, whose tokenizer differs (fine-tuning to new labels).

    Every parameter but the per-token rows is copied as is. A token's rows (predictor embedding, joint and CTC
    outputs) come from the old token with the same text, or the same text once lower-cased ("▁What" from
    "▁what"), the blank's from the old blank. A word piece without such a match ("▁Monday") takes its output rows
    from the first old token of its text (lower-cased for a lower-case old model) (where the old model started emitting it) and its embedding from the last
    (the old predictor's input after it); punctuation keeps its fresh initialisation.
    """
    import torch
    from nemo.collections.asr.models import ASRModel

    from pipecat_nemotron.asr.loading import quiet_nemo

    with quiet_nemo(logging.WARNING):
        old = ASRModel.restore_from(str(source), map_location="cpu")
    old_ids = {p: i for i, p in enumerate(old.tokenizer.ids_to_tokens(list(range(old.tokenizer.vocab_size))))}
    new_pieces = model.tokenizer.ids_to_tokens(list(range(model.tokenizer.vocab_size)))
    old_cased = any(c.isupper() for p in old_ids for c in p)  # spell new pieces with the old model's case
    first: dict[int, int] = {len(new_pieces): old.tokenizer.vocab_size}  # blank
    last = dict(first)
    for i, piece in enumerate(new_pieces):
        if piece in MARKER_ROWS and MARKER_ROWS[piece] in old_ids:
            first[i] = last[i] = old_ids[MARKER_ROWS[piece]]
        elif piece in old_ids or piece.lower() in old_ids:
            first[i] = last[i] = old_ids.get(piece, old_ids.get(piece.lower()))
        elif any(c.isalpha() for c in piece):
            text = piece.replace(WORD_MARK, " ").strip()
            ids = old.tokenizer.text_to_ids(text if old_cased else text.lower())
            if ids:
                first[i], last[i] = ids[0], ids[-1]
    old_state, state = old.state_dict(), model.state_dict()
    with torch.no_grad():
        for name, value in old_state.items():
            rows = last if name.startswith("decoder.prediction.embed") else first
            if name not in _TOKEN_ROWS:
                state[name].copy_(value)
                continue
            for new_id, old_id in rows.items():
                state[name][new_id] = value[old_id]
    exact = sum(p in old_ids or p.lower() in old_ids for p in new_pieces)
    fresh = [p for i, p in enumerate(new_pieces) if i not in first]
    markers = [f"{p} from {MARKER_ROWS[p]!r}" for p in new_pieces if p in MARKER_ROWS and p not in old_ids]
    print(
        f"[train] initialised from {source}: of {len(new_pieces)} tokens {exact} copied, "
        f"{len(new_pieces) - exact - len(fresh) - len(markers)} from their old pieces, "
        f"markers: {' '.join(markers) or 'none'}, new: {' '.join(fresh)}",
        flush=True,
    )


def stage_train(args: argparse.Namespace) -> None:
    """Train with Lightning on CPU; keeps the best (val WER at 160 ms) and the last checkpoint."""
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    torch.set_num_threads(args.threads)
    pl.seed_everything(args.seed, workers=True)
    run_dir = Path(args.run_dir)
    if run_dir.exists() and not args.resume:
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt = ModelCheckpoint(
        dirpath=str(run_dir / "checkpoints"),
        filename="best-{step}-{val_wer:.4f}",
        monitor="val_wer",
        mode="min",
        save_top_k=1,
        save_last=args.checkpoint_minutes <= 0,  # else the periodic checkpoint below owns last.ckpt
    )
    schedule = lightning_callback(StepOrClockCosine)(
        args.lr,
        args.lr / 100,
        args.warmup_steps,
        args.max_steps,
        args.max_minutes * 60,
        args.stop_step,
        args.elapsed_minutes * 60,
    )
    callbacks = [ckpt, lightning_callback(Progress)(args.print_every), schedule]
    if args.checkpoint_minutes > 0:  # last.ckpt every few minutes, so a killed run loses little (--resume)
        from datetime import timedelta

        callbacks.append(
            ModelCheckpoint(
                dirpath=str(run_dir / "checkpoints"),
                filename="periodic",
                save_last=True,
                train_time_interval=timedelta(minutes=args.checkpoint_minutes),
            )
        )
    trainer = _trainer(args, run_dir, callbacks)
    model = _training_model(args, trainer)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"[train] params {n_params:,}; max_steps {args.max_steps}; max_minutes {args.max_minutes}; "
        f"threads {torch.get_num_threads()}",
        flush=True,
    )
    t0 = time.perf_counter()
    last = run_dir / "checkpoints" / "last.ckpt"
    resume = str(last) if args.resume and last.exists() else None  # nothing saved yet: start afresh
    if resume:
        print(f"[train] resuming from {resume}", flush=True)
    trainer.fit(model, ckpt_path=resume)
    minutes = (time.perf_counter() - t0) / 60
    # The schedule can stop between validations: validate and keep the final weights too.
    final_ckpt = run_dir / "checkpoints" / "final.ckpt"
    trainer.save_checkpoint(str(final_ckpt))
    final_wer = float(trainer.validate(model, dataloaders=model._validation_dl, verbose=False)[0]["val_wer"])
    best_path, best_wer = ckpt.best_model_path, ckpt.best_model_score
    if best_wer is None or final_wer <= float(best_wer):
        best_path, best_wer = str(final_ckpt), final_wer
    info = {
        "train_minutes": round(minutes, 1),
        "global_step": trainer.global_step,
        "schedule_clock_driven": schedule.clock_driven,
        "final_val_wer": final_wer,
        "best_checkpoint": best_path,
        "best_val_wer": float(best_wer),
        "params": n_params,
        "args": vars(args),
    }
    (run_dir / "train_info.json").write_text(json.dumps(info, indent=1, default=str))
    print(f"[train] done: {json.dumps(info, default=str)}", flush=True)


# The recipe of the bundled model, as it was run on a shared 2-core CPU (see docs/TINY_MODEL.md). Each phase starts
# from the previous phase's best weights with a fresh warm-up; phases 1 and 2 were stopped early (``stop_step``)
# and restarted with a longer schedule when progress was slower than planned.
RECIPE_PHASES: tuple[dict[str, Any], ...] = (
    # Phase 1: SpecAugment on; ran clock-driven and was stopped at step 2,500 (val WER 66%).
    {
        "lr": 2e-3,
        "warmup_steps": 300,
        "max_steps": 3500,
        "max_minutes": 72.0,
        "stop_step": 2500,
        "spec_augment": True,
    },
    # Phase 2: SpecAugment off; stopped at step 500 (val WER 52%) to restart with a longer schedule.
    {
        "lr": 1.5e-3,
        "warmup_steps": 100,
        "max_steps": 3000,
        "max_minutes": 40.0,
        "stop_step": 500,
        "spec_augment": False,
    },
    # Phase 3: SpecAugment off, 60-minute / 4,000-step cosine schedule; interrupted after step 2,000 (val WER 4.3%)
    # and resumed (``--resume --elapsed-minutes 34``) to the end of its clock-driven schedule.
    {
        "lr": 1.2e-3,
        "warmup_steps": 50,
        "max_steps": 4000,
        "max_minutes": 60.0,
        "stop_step": 0,
        "spec_augment": False,
    },
    # Phase 4: the training set plus the accent-mix set (``accents`` stage) for voices and accents never heard.
    {
        "lr": 8e-4,
        "warmup_steps": 50,
        "max_steps": 2800,
        "max_minutes": 40.0,
        "stop_step": 0,
        "spec_augment": False,
        "train_manifest": "train_mix_manifest.json",
    },
    # Phase 5: adds multi-turn clips (``sessions`` stage) so that speech after a pause is still transcribed when a
    # stream keeps its state across turns (the engine's default soft finalize).
    {
        "lr": 5e-4,
        "warmup_steps": 50,
        "max_steps": 1200,
        "max_minutes": 22.0,
        "stop_step": 0,
        "spec_augment": False,
        "train_manifest": "train_all_manifest.json",
    },
)


def stage_recipe(args: argparse.Namespace) -> None:
    """Train the bundled model's phases in sequence (runs/tiny_asr, runs/tiny_asr_p2, ...); ``export`` then uses
    the last phase's run directory."""
    init_from: str | None = None
    run_dir = str(RUN_DIR)
    for i, phase in enumerate(RECIPE_PHASES, 1):
        run_dir = str(RUN_DIR) if i == 1 else f"{RUN_DIR}_p{i}"
        phase_args = argparse.Namespace(**{**vars(args), **phase, "run_dir": run_dir, "init_from": init_from})
        print(f"[recipe] phase {i}: {json.dumps(phase)}", flush=True)
        stage_train(phase_args)
        init_from = json.loads((Path(run_dir) / "train_info.json").read_text())["best_checkpoint"]
    args.run_dir = run_dir


def stage_export(args: argparse.Namespace) -> None:
    """Load the best checkpoint and save a self-contained ``.nemo`` (tokenizer inside)."""
    import torch

    run_dir = Path(args.run_dir)
    ckpt_path = Path(args.checkpoint) if args.checkpoint else None
    if ckpt_path is None:
        info = json.loads((run_dir / "train_info.json").read_text())
        ckpt_path = Path(info["best_checkpoint"] or run_dir / "checkpoints" / "last.ckpt")
    model = build_model(args)
    state = torch.load(ckpt_path, map_location="cpu", weights_only=False)["state_dict"]
    model.load_state_dict(state)
    model.eval()
    # Datasets point at this machine's data/ folder; a shipped model must not carry them.
    from omegaconf import open_dict

    from pipecat_nemotron.asr.loading import quiet_nemo

    with open_dict(model.cfg):
        for key in ("train_ds", "validation_ds", "test_ds"):
            model.cfg[key]["manifest_filepath"] = None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with quiet_nemo(logging.WARNING):
        model.save_to(str(out))
    size = out.stat().st_size
    print(f"[export] {ckpt_path.name} -> {out} ({size / 1e6:.2f} MB)", flush=True)
    if size > 10_000_000:
        raise SystemExit(f"{out} is {size / 1e6:.1f} MB, over the 10 MB budget: shrink the model")


# --------------------------------------------------------------------------------------------------------------
# Bundled assets
# --------------------------------------------------------------------------------------------------------------
# Demo sentences: all are held-out ("test" bucket) sentences, never heard in training; training voices.
DEMO_FILES: tuple[tuple[str, str, str, int], ...] = (
    # (file, text, voice, words per minute)
    ("demo_weather.wav", "hello what is the weather on monday please", "en-us+m3", 165),
    ("demo_timer.wav", "hi set a timer for twenty minutes thanks", "en-gb+f3", 160),
    ("demo_math.wav", "hello what is four times six", "en-us+Alex", 165),
)
TWO_TURNS: tuple[str, str] = ("what is two plus two", "hi what time is it please")
TWO_TURNS_GAP_S = 1.2


def stage_assets(args: argparse.Namespace) -> None:
    """Demo wavs (package assets) and the CI held-out subset (tests/assets/heldout, from the full sets)."""
    for text in [t for _, t, _, _ in DEMO_FILES] + list(TWO_TURNS):
        if heldout_bucket(text) != "test":
            raise ValueError(f"demo sentence {text!r} is not a held-out sentence")
    rng = random.Random(args.seed + 2)
    written = punctuate if args.labels == "cased" else str  # the golden transcripts, as the model writes
    # --- demo ---
    if DEMO_AUDIO_DIR.exists():
        shutil.rmtree(DEMO_AUDIO_DIR)
    DEMO_AUDIO_DIR.mkdir(parents=True)
    transcripts: dict[str, str] = {}
    for fname, text, voice, speed in DEMO_FILES:
        x = augment(synth_raw(text, voice, speed, 50, 1), rng.randrange(2**31), "none")
        write_wav(DEMO_AUDIO_DIR / fname, x)
        transcripts[fname] = written(text)
    # Two turns separated by ~1.2 s of digital silence (for turn-taking demos and tests).
    a = _trim_silence(synth_raw(TWO_TURNS[0], "en-us", 165, 45, 1))
    b = _trim_silence(synth_raw(TWO_TURNS[1], "en-us+m3", 165, 45, 1))
    peak = max(np.abs(a.astype(np.int32)).max(), np.abs(b.astype(np.int32)).max())
    a, b = (np.round(v * (0.5 * 32767 / peak)).astype(np.int16) for v in (a, b))
    lead, gap, tail = (np.zeros(int(t * MODEL_SAMPLE_RATE), np.int16) for t in (0.3, TWO_TURNS_GAP_S, 0.5))
    write_wav(DEMO_AUDIO_DIR / "two_turns.wav", np.concatenate([lead, a, gap, b, tail]))
    transcripts["two_turns.wav"] = " ".join(written(t) for t in TWO_TURNS)
    t_a = (lead.size / MODEL_SAMPLE_RATE, (lead.size + a.size) / MODEL_SAMPLE_RATE)
    t_b0 = (lead.size + a.size + gap.size) / MODEL_SAMPLE_RATE
    turns = {
        "two_turns.wav": {
            "turns": [written(t) for t in TWO_TURNS],
            "spans_s": [
                [round(t_a[0], 3), round(t_a[1], 3)],
                [round(t_b0, 3), round(t_b0 + b.size / MODEL_SAMPLE_RATE, 3)],
            ],
            "silence_between_s": TWO_TURNS_GAP_S,
        }
    }
    (DEMO_AUDIO_DIR / "transcripts.json").write_text(json.dumps(transcripts, indent=1) + "\n")
    (DEMO_AUDIO_DIR / "turns.json").write_text(json.dumps(turns, indent=1) + "\n")
    for fname in sorted(p.name for p in DEMO_AUDIO_DIR.glob("*.wav")):
        n = read_pcm16(DEMO_AUDIO_DIR / fname).size
        print(f"[assets] demo/{fname}: {n / MODEL_SAMPLE_RATE:.2f} s", flush=True)

    # --- CI held-out subset: every ``ci_every``-th utterance of each full held-out set, as FLAC ---
    # A fixed stride over the full sets (not a fresh draw) so that the subset is spread over both halves of the
    # unseen-voice set (unseen accent / unseen variants) and the CI figures estimate the model card's.
    if HELDOUT_DIR.exists():
        shutil.rmtree(HELDOUT_DIR)
    HELDOUT_DIR.mkdir(parents=True)
    import soundfile

    manifest = []
    for split in ("seen_voice", "unseen_voice"):
        full = DATA_DIR / f"test_{split}_manifest.json"
        if not full.exists():
            raise SystemExit(f"{full} is missing: run the `heldout` stage first")
        rows = [json.loads(line) for line in full.open()][:: args.ci_every]
        for r in rows:
            name = Path(r["audio_filepath"]).with_suffix(".flac").name
            soundfile.write(str(HELDOUT_DIR / name), read_pcm16(Path(r["audio_filepath"])), MODEL_SAMPLE_RATE)
            manifest.append({"audio": name, "text": r["text"], "split": split, "voice": r["voice"]})
    (HELDOUT_DIR / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(p.stat().st_size for p in HELDOUT_DIR.iterdir())
    print(f"[assets] tests/assets/heldout: {len(manifest)} utterances, {total / 1e6:.2f} MB", flush=True)


def _trim_silence(x: np.ndarray, thresh: int = 100) -> np.ndarray:
    idx = np.flatnonzero(np.abs(x.astype(np.int32)) > thresh)
    return x if idx.size == 0 else x[max(0, idx[0] - 800) : idx[-1] + 1600]


# --------------------------------------------------------------------------------------------------------------
#: Options of the data stages: name -> (default, help); each flag's type is its default's.
DATA_OPTIONS: dict[str, tuple[Any, str]] = {
    "workers": (2, "processes for synthesis"),
    "n_train": (16000, "training utterances"),
    "n_val": (300, "validation utterances (new sentences)"),
    "n_test": (300, "full held-out sets: utterances per set"),
    "ci_every": (3, "CI held-out subset: every N-th utterance of each full held-out set"),
    "n_accents": (8000, "accent-mix training utterances"),
    "n_sessions": (3000, "multi-turn training clips"),
    "n_paused": (3000, "training clips with a pause inside a sentence (paused stage)"),
    "n_turns": (3000, "multi-turn training clips with live-session pauses (turns stage)"),
    "n_lead": (3000, "training clips after a long leading silence (silences stage)"),
    "max_lead_s": (5.0, "silences stage: longest leading silence, s"),
}
#: Model sizes and training settings: name -> (default, help or None).
TRAINING_OPTIONS: dict[str, tuple[Any, str | None]] = {
    "vocab_size": (128, None),
    "d_model": (128, None),
    "n_layers": (4, None),
    "subsampling_channels": (128, None),
    "pred_hidden": (128, None),
    "ctc_weight": (0.3, None),
    "batch_size": (16, None),
    "num_workers": (1, None),
    "lr": (2e-3, None),
    "warmup_steps": (300, None),
    "max_steps": (3500, None),
    "max_minutes": (72.0, "wall-clock budget: the LR decay ends and training stops by then"),
    "val_every": (500, None),
    "print_every": (50, None),
    "threads": (2, None),
    "elapsed_minutes": (
        0.0,
        "with --resume: minutes the interrupted run had already trained (continues the clock-driven schedule)",
    ),
    "stop_step": (0, "stop at this step, before the schedule ends"),
    "checkpoint_minutes": (0.0, "also write last.ckpt every this many minutes of training (0: at validations only)"),
}


def add_options(group: argparse._ArgumentGroup, options: dict[str, tuple[Any, str | None]]) -> None:
    """``--<name>`` per entry of ``options``, typed like its default."""
    for name, (default, help_text) in options.items():
        group.add_argument("--" + name.replace("_", "-"), type=type(default), default=default, help=help_text)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "stages", nargs="+", choices=["all", "data", "accents", "sessions", "turns", "paused", "silences", "cased", "heldout", "tokenizer", "train", "recipe", "export", "assets"],
        help="stages to run, in the order given ('all' = data accents sessions tokenizer recipe export assets)",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=1234)
    add_options(p.add_argument_group("data"), DATA_OPTIONS)
    train = p.add_argument_group("model and training")
    train.add_argument(
        "--train-manifest",
        default="train_manifest.json",
        help="training manifest under data/tiny_asr/ (phase 4: train_mix_manifest.json, phase 5: train_all_manifest.json)",
    )
    train.add_argument(
        "--val-manifest",
        default="val_manifest.json",
        help="validation manifest under data/tiny_asr/ (validation is slow on a busy CPU: a subset keeps it short)",
    )
    add_options(train, TRAINING_OPTIONS)
    train.add_argument(
        "--labels",
        choices=["plain", "cased"],
        default="plain",
        help="training labels: lower case without punctuation, or cased and punctuated (the cased stage's manifests)",
    )
    train.add_argument(
        "--tokenizer-dir",
        default="",
        help="tokenizer folder under data/tiny_asr/ (default: tokenizer, or tokenizer_cased with --labels cased)",
    )
    train.add_argument("--resume", action="store_true", help="resume from <run-dir>/checkpoints/last.ckpt")
    train.add_argument(
        "--init-from-nemo",
        default=None,
        help="start from a .nemo model with another tokenizer: all weights but the per-token rows are copied, and "
        "a token's rows come from the old token of the same lower-case text where there is one",
    )
    train.add_argument(
        "--init-from", default=None, help="start training from this checkpoint's weights (new schedule)"
    )
    train.add_argument(
        "--spec-augment",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="SpecAugment during training",
    )
    train.add_argument(
        "--fast-rnnt-loss",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the RNNT loss vectorised over labels (FastRNNTLoss; same values as NeMo's pure-PyTorch loss, which "
        "the five phases of the bundled model used)",
    )
    train.add_argument("--run-dir", default=str(RUN_DIR))
    export = p.add_argument_group("export")
    export.add_argument("--checkpoint", default=None, help="export this checkpoint instead of the best one")
    export.add_argument("--out", default=str(TINY_MODEL_PATH))
    return p.parse_args(argv)


def run_stages(
    args: argparse.Namespace,
    stages: dict[str, Callable[[argparse.Namespace], None]],
    everything: Sequence[str],
) -> None:
    """Run ``args.stages`` in the order given (``all`` = ``everything``), timing each, from the repository root.

    Args:
        args: The parsed command line (``stages`` and ``seed`` are read here).
        stages: Stage name -> the function that runs it.
        everything: The stages ``all`` stands for, in order.
    """
    # With OpenMP's default busy-wait, two torch threads sharing 2 cores with another busy process ran 2-10x
    # slower per step than with passive waiting (measured). Must be set before torch is imported.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.chdir(REPO_ROOT)
    random.seed(args.seed)
    np.random.seed(args.seed % 2**32)
    for name in [s for asked in args.stages for s in (everything if asked == "all" else [asked])]:
        t0 = time.perf_counter()
        stages[name](args)
        print(f"[{name}] {time.perf_counter() - t0:.1f} s", flush=True)
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> None:
    """Run the requested stages."""
    stages = {
        "data": stage_data,
        "accents": stage_accents,
        "sessions": stage_sessions,
        "turns": stage_turns,
        "paused": stage_paused,
        "silences": stage_silences,
        "cased": stage_cased,
        "heldout": stage_heldout_full,
        "tokenizer": stage_tokenizer,
        "train": stage_train,
        "recipe": stage_recipe,
        "export": stage_export,
        "assets": stage_assets,
    }
    run_stages(
        parse_args(argv), stages, ["data", "accents", "sessions", "tokenizer", "recipe", "export", "assets"]
    )


if __name__ == "__main__":
    main()
