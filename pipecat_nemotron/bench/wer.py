"""Word error rate: text normalisation, word-level edit distance and a corpus counter.

The one home of the WER helpers of the benchmarks, the evaluation scripts and the tests.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass


def normalize_text(text: str) -> str:
    """Lower case; letters, digits, apostrophes and single spaces only."""
    return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split())


def word_errors(ref: str, hyp: str) -> int:
    """Word-level Levenshtein distance (substitutions + deletions + insertions) of normalised texts."""
    r, h = normalize_text(ref).split(), normalize_text(hyp).split()
    prev = list(range(len(h) + 1))
    for i, rw in enumerate(r, 1):
        cur = [i] + [0] * len(h)
        for j, hw in enumerate(h, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (rw != hw))
        prev = cur
    return prev[-1]


@dataclass
class WordErrorCount:
    """Word errors and reference words accumulated over a corpus.

    Attributes:
        errors: Word errors (substitutions + deletions + insertions).
        words: Words of the normalised references.

    """

    errors: int = 0
    words: int = 0

    def add(self, ref: str, hyp: str) -> int:
        """Count one utterance; return its word errors."""
        errors = word_errors(ref, hyp)
        self.errors += errors
        self.words += len(normalize_text(ref).split())
        return errors

    @property
    def percent(self) -> float:
        """Word error rate in percent (0 before any reference word)."""
        return 100.0 * self.errors / max(1, self.words)


def wer_percent(refs: Sequence[str | None], hyps: Sequence[str]) -> float | None:
    """Corpus WER in percent over the clips that have a reference (None if none has)."""
    count = WordErrorCount()
    for ref, hyp in zip(refs, hyps, strict=True):
        if ref is not None:
            count.add(ref, hyp)
    return count.percent if count.words else None
