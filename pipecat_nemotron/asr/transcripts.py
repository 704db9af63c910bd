"""From token ids to text, words and records: what the scheduler hands its streams.

The policy (:mod:`~pipecat_nemotron.asr.policy`) decides when a partial, a final or a peek answer is due;
this module says what it contains. :func:`extended_utterance` runs on the worker thread (detokenising and word
alignment are the costly part), the builders on the event loop. No torch here: the tokenizer is reached through
:class:`TextModel`.
"""

from __future__ import annotations

from typing import Protocol

from pipecat_nemotron.asr.audio import SAMPLES_PER_MS
from pipecat_nemotron.asr.state import PendingFinal, PendingPeek, StreamState
from pipecat_nemotron.asr.step_plan import ItemOutput, UtteranceText
from pipecat_nemotron.asr.types import Transcript, WordTiming
from pipecat_nemotron.asr.words import TokenTrace, utterance_confidence


class WordSource(Protocol):
    """Groups tokens into timed words (:class:`~pipecat_nemotron.asr.words.WordAligner`)."""

    def words(
        self, tokens: list[int], trace: TokenTrace, start_ms: float, utterance_ms: float | None = None
    ) -> tuple[WordTiming, ...]:
        """The timed words of an utterance's tokens."""
        ...

    def starts_word(self, token: int) -> bool:
        """Whether ``token`` starts a word."""
        ...


class TextModel(Protocol):
    """The part of the model runner that turns tokens into text and words."""

    @property
    def aligner(self) -> WordSource:
        """The word aligner."""
        ...

    def detokenize(self, tokens: list[int]) -> str:
        """Text of a token sequence."""
        ...


def extended_utterance(state: StreamState, out: ItemOutput, text: TextModel) -> UtteranceText:
    """The stream's utterance with one step's new tokens: tokens, text, trace and words (worker thread).

    Reads the stream's state and writes none of it: the policy applies the result between steps.
    """
    tokens = state.tokens + out.tokens
    trace = state.trace.extended(out.frames, out.confidence)
    words = text.aligner.words(tokens, trace, state.utterance_origin / SAMPLES_PER_MS)
    return UtteranceText(tokens, text.detokenize(tokens), trace, words)


def partial_update(state: StreamState, queue_ms: float, step_ms: float, lag_ms: float) -> Transcript:
    """The partial that shows the stream's utterance so far (times in ms)."""
    return Transcript(
        text=state.text,
        kind="partial",
        utterance=state.utterance_index,
        latency_ms=state.latency_ms,
        language=state.language,
        queue_ms=queue_ms,
        step_ms=step_ms,
        lag_ms=lag_ms,
        words=state.words,
        confidence=utterance_confidence(state.words),
        start_ms=state.utterance_origin / SAMPLES_PER_MS,
    )


def eou_update(
    state: StreamState, frame: int, hop: int, step_ms: float, end_sample: int | None = None
) -> Transcript:
    """The stream's end-of-utterance event: the model emitted ``<EOU>`` at mel frame ``frame`` of the utterance.

    Args:
        state: The stream, with the step that emitted it applied (its text is the utterance's so far).
        frame: The last mel frame (from the utterance's start) of the encoder frame it was emitted at.
        hop: Samples (16 kHz) per mel frame.
        step_ms: Duration of the step, ms.
        end_sample: Where the utterance ends (absolute stream sample), when the step was its final flush: the
            flush's last encoder frame may reach past the audio, the time never does.

    """
    start_ms = state.utterance_origin / SAMPLES_PER_MS
    at_ms = start_ms + max(0, frame) * hop / SAMPLES_PER_MS
    if end_sample is not None:
        at_ms = min(at_ms, end_sample / SAMPLES_PER_MS)
    return Transcript(
        text=state.text,
        kind="eou",
        utterance=state.utterance_index,
        latency_ms=state.latency_ms,
        language=state.language,
        step_ms=step_ms,
        words=state.words,
        confidence=utterance_confidence(state.words),
        start_ms=start_ms,
        eou_ms=max(start_ms, at_ms),
    )


def final_update(state: StreamState, pending: PendingFinal, ttf_ms: float, step_ms: float, text: TextModel) -> Transcript:
    """The final of the stream's utterance, which ends at ``pending.boundary``.

    One record: the stream's ``updates()`` deliver it and ``finalize()`` resolves with it.
    """
    audio_ms = (pending.boundary - state.utterance_origin) / SAMPLES_PER_MS
    start_ms = state.utterance_origin / SAMPLES_PER_MS
    words = text.aligner.words(state.tokens, state.trace, start_ms, audio_ms)
    return Transcript(
        text=state.text,
        kind="final",
        utterance=state.utterance_index,
        latency_ms=state.latency_ms,
        language=state.language,
        detected_language=state.detected_language,
        step_ms=step_ms,
        ttf_ms=ttf_ms,
        words=words,
        confidence=utterance_confidence(words),
        start_ms=start_ms,
        utterance_audio_ms=audio_ms,
        tokens=tuple(state.tokens),
    )


def peek_record(
    state: StreamState, pending: PendingPeek, new_tokens: list[int], now: float, text: TextModel
) -> Transcript:
    """The answer to ``pending``: the utterance's tokens so far plus the peek flush's ``new_tokens``.

    Args:
        state: The stream.
        pending: The peek request.
        new_tokens: Tokens of the flush on copies of the stream's caches (empty: nothing was left to flush).
        now: Monotonic time of the answer, seconds.
        text: Detokenises the tokens.

    """
    tokens = state.tokens + new_tokens
    return Transcript(
        text=text.detokenize(tokens) if new_tokens else state.text,
        kind="peek",
        utterance=pending.utterance,
        start_ms=state.utterance_origin / SAMPLES_PER_MS,
        utterance_audio_ms=(pending.boundary - state.utterance_origin) / SAMPLES_PER_MS,
        latency_ms=state.latency_ms,
        language=state.language,
        peek_ms=(now - pending.requested_at) * 1000.0,
        tokens=tuple(tokens),
    )
