"""Words with timings and confidence, from what NeMo's greedy RNNT decoder reports for each token.

The label-looping greedy decoder records, for every token it emits, the encoder frame it was emitted at
(``Hypothesis.timestamp``) and, with a confidence config, a confidence computed from the joint's output
distribution at that step (``Hypothesis.token_confidence``). Each engine step decodes only the step's new
encoder frames, so its frame indices start at 0; the runner places them on the utterance's mel-frame grid
(:attr:`TokenTrace.frames`), which also accounts for the pre-encode cache that soft-finalized utterances start
with. This module turns an utterance's tokens, frames and confidences into words.

SentencePiece pieces that start with ``"▁"`` start a word. As in NeMo's own RNNT timestamps, a token spans the
one encoder frame it was emitted at; a word spans its first token's frame start to its last token's frame end,
shifted by constant offsets measured on speech (:class:`TimingCalibration`, see ``docs/TRANSCRIPTS.md``).
Punctuation pieces (no letter or digit: ``?``, ``,``) belong to the word before in the text ("it?") but not in
time: a cased, punctuated model emits them frames after the word's last sound, so a word ends at its last piece
that has a letter or digit, as NeMo's timestamps place punctuation at the previous token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipecat_nemotron.asr.types import WordTiming

#: SentencePiece's word-boundary marker.
WORD_START = "\u2581"

#: Most word texts remembered by :class:`WordAligner` (partials re-read the same words step after step).
_TEXT_CACHE_SIZE = 4096


@dataclass
class TokenTrace:
    """Where and how surely the current utterance's tokens were emitted (one per stream, reset per utterance).

    Attributes:
        frames: For each token, the last mel frame (10 ms frames, counted from the utterance's start) of the
            encoder frame it was emitted at.
        confidence: Confidence of each token, in [0, 1].

    """

    frames: list[int] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)

    def extended(self, frames: list[int], confidence: list[float]) -> TokenTrace:
        """A new trace: this one followed by one step's tokens (this one is left as it is)."""
        return TokenTrace(self.frames + frames, self.confidence + confidence)


@dataclass(frozen=True)
class TimingCalibration:
    """Constant corrections from token frames to word times.

    Attributes:
        start_offset_ms: Added to a word's first token frame start (negative: RNNT emits a token after the
            audio that carries it).
        end_offset_ms: Added to a word's last token frame end.

    """

    start_offset_ms: float = 0.0
    end_offset_ms: float = 0.0


#: Offsets measured with ``scripts/eval_word_timings.py --raw`` on espeak-ng word clips, by model file name.
MEASURED_CALIBRATIONS: dict[str, TimingCalibration] = {
    "tiny_nemotron_asr.nemo": TimingCalibration(start_offset_ms=-383.0, end_offset_ms=-69.0),
}


def calibration_for(model: str, offsets_ms: tuple[float, float] | None = None) -> TimingCalibration:
    """The timing offsets for ``model``: ``offsets_ms`` if given, else the measured ones, else none."""
    if offsets_ms is not None:
        return TimingCalibration(float(offsets_ms[0]), float(offsets_ms[1]))
    name = model.replace("\\", "/").rsplit("/", 1)[-1]
    return MEASURED_CALIBRATIONS.get(name, TimingCalibration())


class WordAligner:
    """Groups an utterance's tokens into :class:`WordTiming` objects.

    Args:
        tokenizer: The model's NeMo SentencePiece tokenizer (``ids_to_tokens``, ``ids_to_text``, ``vocab_size``).
        hop_ms: Mel frame hop, ms (10 ms).
        subsampling: Mel frames per encoder frame (8: an encoder frame is 80 ms).
        calibration: Constant offsets applied to word starts and ends.

    Attributes:
        enabled: False: :meth:`words` returns no words (``EngineConfig.word_timings=False``).

    """

    def __init__(
        self, tokenizer: Any, hop_ms: float, subsampling: int, calibration: TimingCalibration | None = None
    ) -> None:
        self.enabled = True
        self.tokenizer = tokenizer
        self.hop_ms = hop_ms
        self.frame_ms = hop_ms * subsampling
        self.calibration = calibration or TimingCalibration()
        pieces = tokenizer.ids_to_tokens(list(range(int(tokenizer.vocab_size))))
        self._starts_word = [str(piece).startswith(WORD_START) for piece in pieces]
        self._sounds = [any(c.isalnum() for c in str(piece)) for piece in pieces]
        self._text: dict[tuple[int, ...], str] = {}

    def starts_word(self, token: int) -> bool:
        """Whether ``token`` starts a word (a piece with SentencePiece's ``"▁"``, or an id past the vocabulary)."""
        return token >= len(self._starts_word) or self._starts_word[token]

    def _sound_end(self, tokens: list[int], first: int, last: int) -> int:
        """Index of the word's last token that is not punctuation (``last - 1`` if all are)."""
        for i in range(last - 1, first - 1, -1):
            if tokens[i] >= len(self._sounds) or self._sounds[tokens[i]]:
                return i
        return last - 1

    def _word_text(self, ids: tuple[int, ...]) -> str:
        text = self._text.get(ids)
        if text is None:
            if len(self._text) >= _TEXT_CACHE_SIZE:
                self._text.clear()
            text = self._text[ids] = self.tokenizer.ids_to_text(list(ids)).strip()
        return text

    def spans(self, tokens: list[int]) -> list[tuple[int, int]]:
        """``[first, last)`` token index ranges of the words in ``tokens``."""
        spans: list[tuple[int, int]] = []
        begin = 0
        for i in range(1, len(tokens) + 1):
            if i == len(tokens) or self.starts_word(tokens[i]):
                if i > begin:
                    spans.append((begin, i))
                begin = i
        return spans

    def words(
        self,
        tokens: list[int],
        trace: TokenTrace,
        start_ms: float,
        utterance_ms: float | None = None,
    ) -> tuple[WordTiming, ...]:
        """The words of an utterance's tokens.

        Args:
            tokens: Token ids of the utterance (as many as ``trace.frames``).
            trace: Frames and confidences of the tokens.
            start_ms: Where the utterance starts, ms from the stream's first sample (a word's
                ``utterance_start_ms`` counts from here).
            utterance_ms: Audio in the utterance so far, ms (word ends are clipped to it); None: no clipping.

        Returns:
            Words in order; starts never decrease and every word ends at or after its start.

        """
        if not self.enabled or len(trace.frames) != len(tokens) or len(trace.confidence) != len(tokens):
            return ()
        out: list[WordTiming] = []
        previous_start = 0.0
        for first, last in self.spans(tokens):
            text = self._word_text(tuple(tokens[first:last]))
            if not text:
                continue
            frame_start = trace.frames[first] * self.hop_ms - self.frame_ms
            start = max(previous_start, frame_start + self.calibration.start_offset_ms)
            end = (
                trace.frames[self._sound_end(tokens, first, last)] * self.hop_ms
                + self.calibration.end_offset_ms
            )
            if utterance_ms is not None:
                start, end = min(start, utterance_ms), min(end, utterance_ms)
            end = max(end, start)
            previous_start = start
            out.append(
                WordTiming(
                    text=text,
                    start_ms=start_ms + start,
                    end_ms=start_ms + end,
                    utterance_start_ms=start,
                    utterance_end_ms=end,
                    confidence=min(trace.confidence[first:last]),
                )
            )
        return tuple(out)


def utterance_confidence(words: tuple[WordTiming, ...]) -> float | None:
    """Confidence of an utterance: the mean of its words' confidences (None without words)."""
    if not words:
        return None
    return sum(w.confidence for w in words) / len(words)
