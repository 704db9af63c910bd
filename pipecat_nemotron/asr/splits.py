"""Forced splits: no utterance grows past ``EngineConfig.max_utterance_s``.

Every partial, peek and final carries its whole utterance (text and words), so a user who talks for minutes
without a pause would get ever larger replies (about 86 bytes per word with word timings: a 5-minute final was
76 KB). When the audio decoded in the current utterance reaches the limit, the scheduler splits it between two
steps: the words emitted before a cut point become a final of their own (a :class:`Transcript` with
``kind="final"`` and ``forced=True``, delivered in order like any final), and the speech goes on as the next
utterance.

The split is bookkeeping only: the decode itself goes on untouched (same encoder caches, decoder state and
feature segment, in both finalize modes), so no word is lost or decoded differently, and the tokens of the
forced finals and of the final that ends the speech, concatenated, are exactly those of the same audio decoded
as one utterance.

Where it cuts: in the last :data:`SPLIT_WINDOW_S` seconds before the limit (at most a quarter of it), at the
longest run of blank frames between two words (the middle of it), counted in the frames where the decoder
emitted the words' tokens; the trailing blank run after the last word counts too. So the cut lands in a pause
if the window has one, else between the two words furthest apart; only a window without any word boundary
(one "word" longer than the window) is cut at the limit, between two tokens. The forced final's audio ends at
the cut; the next utterance starts there (its ``start_ms`` and word times count from the cut). A forced final
of an ``auto`` stream carries no ``detected_language``; the final that ends the speech reports the language of
the audio decoded after the last split.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from pipecat_nemotron.asr.audio import SAMPLES_PER_MS
from pipecat_nemotron.asr.state import StreamState
from pipecat_nemotron.asr.transcripts import TextModel
from pipecat_nemotron.asr.types import Transcript
from pipecat_nemotron.asr.words import TokenTrace, utterance_confidence

#: Length of the stretch before the limit where a split looks for a pause, seconds (at most a quarter of the
#: limit).
SPLIT_WINDOW_S = 5.0


@dataclass(frozen=True)
class Split:
    """Where to split an utterance.

    Attributes:
        tokens: Tokens that end the forced final (the rest start the next utterance).
        cut_frame: Mel frame, counted from the utterance's start, where the next utterance starts.

    """

    tokens: int
    cut_frame: int


def window_frames(limit_frames: int) -> int:
    """Mel frames of the search window before a limit of ``limit_frames`` (10 ms frames)."""
    return min(int(SPLIT_WINDOW_S * 100), limit_frames // 4)


def choose_split(
    tokens: list[int],
    frames: list[int],
    starts_word: Callable[[int], bool],
    decoded_frames: int,
    limit_frames: int,
) -> Split | None:
    """The split of an utterance whose decoded audio reached the limit; None while it has not, or has no word.

    Args:
        tokens: The utterance's tokens.
        frames: Mel frame (from the utterance's start) at which each token was emitted, non-decreasing.
        starts_word: Whether a token starts a word.
        decoded_frames: Mel frames of the utterance decoded so far.
        limit_frames: The longest utterance, mel frames.

    """
    if decoded_frames < limit_frames or not tokens or len(frames) != len(tokens):
        return None
    lo, hi = limit_frames - window_frames(limit_frames), limit_frames
    best: tuple[int, int, int] | None = None  # (blank frames in the window, tokens, cut frame)
    for k in range(1, len(tokens) + 1):
        if k < len(tokens) and not starts_word(tokens[k]):
            continue
        after = frames[k] if k < len(tokens) else decoded_frames
        a, b = max(frames[k - 1], lo), min(after, hi)
        if b > a and (best is None or b - a >= best[0]):
            best = (b - a, k, (a + b) // 2)
    if best is not None:
        return Split(best[1], best[2])
    # No word boundary with a blank frame inside the window: cut at the limit, between tokens.
    return Split(sum(1 for f in frames if f < hi), hi)


def join_forced_finals(forced: list[Transcript], last: Transcript) -> Transcript:
    """One result for an utterance split by the limit: its forced finals (in order) then its last final.

    Text joins with spaces (each split falls between words), tokens and words concatenate, ``utterance_audio_ms`` sums
    and the result starts where the first part starts.
    """
    if not forced:
        return last
    words = tuple(w for part in forced for w in part.words) + last.words
    return replace(
        last,
        text=" ".join(t for t in [*(part.text for part in forced), last.text] if t),
        utterance=forced[0].utterance,
        tokens=tuple(t for part in forced for t in part.tokens) + last.tokens,
        words=words,
        confidence=utterance_confidence(words),
        utterance_audio_ms=sum(part.utterance_audio_ms or 0.0 for part in [*forced, last]),
        start_ms=forced[0].start_ms,
    )


def split_utterance(state: StreamState, split: Split, text: TextModel, hop: int) -> Transcript:
    """Split the stream's utterance at ``split``: return the forced final; the rest go on as the next utterance.

    Runs between steps. Requests about the speech that goes on (pending peeks and changes of this utterance
    or later ones) are renamed to the utterance after the split.

    Args:
        state: The stream.
        split: Where to split.
        text: Detokenises and aligns the two parts.
        hop: Samples per mel frame.

    """
    aligner, k = text.aligner, split.tokens
    utterance, head, trace = state.utterance_index, state.tokens[:k], state.trace
    start_ms = state.utterance_origin / SAMPLES_PER_MS
    audio_ms = split.cut_frame * hop / SAMPLES_PER_MS
    words = aligner.words(head, TokenTrace(trace.frames[:k], trace.confidence[:k]), start_ms, audio_ms)
    final = Transcript(
        text=text.detokenize(head),
        kind="final",
        utterance=utterance,
        latency_ms=state.latency_ms,
        language=state.language,
        words=words,
        confidence=utterance_confidence(words),
        start_ms=start_ms,
        utterance_audio_ms=audio_ms,
        tokens=tuple(head),
        forced=True,
    )
    state.tokens = state.tokens[k:]
    state.trace = TokenTrace([f - split.cut_frame for f in trace.frames[k:]], trace.confidence[k:])
    state.utterance_origin += split.cut_frame * hop
    state.text = text.detokenize(state.tokens)
    state.words = aligner.words(state.tokens, state.trace, state.utterance_origin / SAMPLES_PER_MS)
    state.utterance_index = utterance + 1
    # Language detection (``auto``) covers each part from its own start; a forced final carries none.
    state.evidence = None
    state.detected_language = None
    for peek in state.peeks:
        if peek.utterance >= utterance:
            peek.utterance += 1
    if state.pending_utterance > utterance:
        state.pending_utterance += 1
    return final
