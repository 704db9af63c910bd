"""Clips of single espeak-ng words joined by known silences, so every word's true start and end are known.

Each word is synthesised on its own (the held-out sentences of the tiny model, in their training voices),
resampled to 16 kHz with sox (no dither: byte-identical runs) and trimmed to its first and last sample above 1%
of its peak; a clip is lead silence, then the words separated by silences of known length, then tail silence.
"""

from __future__ import annotations

import difflib
import json
import random
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE
from pipecat_nemotron.bench.wer import normalize_text

#: Held-out sentences and voices of the tiny model.
HELDOUT_MANIFEST = Path(__file__).resolve().parent / "assets" / "heldout" / "manifest.json"

#: Silences between words, s: like the tiny model's training speech (espeak-ng's ``-g`` gaps of 0-80 ms).
TRAINING_LIKE_GAPS_S = (0.02, 0.08)

#: A word's sound starts/ends where its amplitude first/last exceeds this fraction of its peak.
TRIM_FRACTION = 0.01


@dataclass(frozen=True)
class WordSpan:
    """A word and where it lies in its clip, ms from the clip's first sample."""

    text: str
    start_ms: float
    end_ms: float


@dataclass(frozen=True)
class WordClip:
    """Float32 16 kHz audio and its words."""

    audio: np.ndarray
    words: tuple[WordSpan, ...]

    @property
    def text(self) -> str:
        """The words, space-separated."""
        return " ".join(w.text for w in self.words)


@cache
def spoken_word(word: str, voice: str, speed: int = 160, pitch: int = 50) -> np.ndarray:
    """One word by espeak-ng, 16 kHz float32, trimmed to where its sound starts and ends."""
    wav = subprocess.run(
        ["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "--stdout", word],
        check=True,
        capture_output=True,
    ).stdout
    raw = subprocess.run(
        ["sox", "-D", "-t", "wav", "-", "-r", str(MODEL_SAMPLE_RATE), "-c", "1", "-b", "16", "-e", "signed",
         "-t", "raw", "-"],
        input=wav,
        check=True,
        capture_output=True,
    ).stdout  # fmt: skip
    x = np.frombuffer(raw, dtype=np.int16).astype(np.float32) / 32768.0
    loud = np.flatnonzero(np.abs(x) > TRIM_FRACTION * np.max(np.abs(x)))
    return x[loud[0] : loud[-1] + 1].copy()


def join_words(
    texts: list[str], voice: str, seed: int, gap_s: tuple[float, float] = (0.05, 0.25), speed: int = 170
) -> WordClip:
    """``texts`` spoken one word at a time by ``voice``, joined by silences drawn from ``gap_s`` (seconds).

    The clip starts with 0.1-0.3 s and ends with 0.3-0.5 s of silence and is scaled to a peak of -12..-3 dBFS
    (the tiny model's training levels).
    """
    rng = random.Random(seed)
    rate = MODEL_SAMPLE_RATE
    parts: list[np.ndarray] = [np.zeros(int(rng.uniform(0.1, 0.3) * rate), np.float32)]
    words: list[WordSpan] = []
    at = parts[0].size
    for i, text in enumerate(texts):
        if i:
            parts.append(np.zeros(int(rng.uniform(*gap_s) * rate), np.float32))
            at += parts[-1].size
        audio = spoken_word(text, voice, speed)
        words.append(WordSpan(text, at * 1000.0 / rate, (at + audio.size) * 1000.0 / rate))
        parts.append(audio)
        at += audio.size
    parts.append(np.zeros(int(rng.uniform(0.3, 0.5) * rate), np.float32))
    audio = np.concatenate(parts)
    audio *= 10 ** (rng.uniform(-12.0, -3.0) / 20) / max(float(np.max(np.abs(audio))), 1e-9)
    return WordClip(audio.astype(np.float32), tuple(words))


def sentence_clips(count: int, gap_s: tuple[float, float] = TRAINING_LIKE_GAPS_S) -> list[WordClip]:
    """The first ``count`` held-out sentences in training voices (tests/assets/heldout), spoken word by word."""
    rows = [r for r in json.loads(HELDOUT_MANIFEST.read_text()) if r["split"] == "seen_voice"][:count]
    return [join_words(r["text"].split(), r["voice"], seed, gap_s) for seed, r in enumerate(rows)]


def matched_words(predicted: list[str], truth: list[str]) -> list[tuple[int, int]]:
    """``(predicted index, true index)`` of the words the two sequences share (longest matching blocks)."""
    # Compared as words: a cased, punctuated model writes "What" and "it?" for "what" and "it".
    a, b = [normalize_text(w) for w in predicted], [normalize_text(w) for w in truth]
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    return [(a + k, b + k) for a, b, n in matcher.get_matching_blocks() for k in range(n)]


def correct_words(predicted: list[str], reference: list[str]) -> list[bool]:
    """For each predicted word, whether the alignment with the reference keeps it (else: substituted or inserted)."""
    correct = [False] * len(predicted)
    for a, _b in matched_words(predicted, reference):
        correct[a] = True
    return correct


@dataclass(frozen=True)
class TimingErrors:
    """Predicted minus true word start and end times of the matched words, ms."""

    start: np.ndarray
    end: np.ndarray
    matched: int
    total: int

    @classmethod
    def measure(cls, clips: list[WordClip], predicted: list[list[tuple[str, float, float]]]) -> TimingErrors:
        """Errors of ``predicted`` ``(text, start_ms, end_ms)`` words against each clip's words."""
        start: list[float] = []
        end: list[float] = []
        for clip, words in zip(clips, predicted, strict=True):
            for a, b in matched_words([w[0] for w in words], [w.text for w in clip.words]):
                start.append(words[a][1] - clip.words[b].start_ms)
                end.append(words[a][2] - clip.words[b].end_ms)
        return cls(np.array(start), np.array(end), len(start), sum(len(c.words) for c in clips))

    def summary(self) -> dict[str, float]:
        """Median and 95th percentile of |error|, share within 200 ms, median signed error; for starts and ends."""
        out: dict[str, float] = {"matched": self.matched, "words": self.total}
        for name, err in (("start", self.start), ("end", self.end)):
            out[f"{name}_median_abs_ms"] = float(np.median(np.abs(err)))
            out[f"{name}_p95_abs_ms"] = float(np.percentile(np.abs(err), 95))
            out[f"{name}_within_200ms"] = float(np.mean(np.abs(err) <= 200.0))
            out[f"{name}_median_ms"] = float(np.median(err))
        return out
