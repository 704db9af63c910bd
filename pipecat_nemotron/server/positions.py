"""Exact audio positions of one session's results (``session_audio_ms`` of partials and finals, word times)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pipecat_nemotron.asr import ASRStream, Transcript
from pipecat_nemotron.asr.types import WordTiming
from pipecat_nemotron.server.protocol import FinalMessage
from pipecat_nemotron.server.protocol_server import words_to_wire


@dataclass(frozen=True)
class _Gap:
    """Audio a client withheld (a ``gap`` message), not yet counted in a final.

    Attributes:
        finalizes_before: ``finalize`` messages the session had read before the gap: the gap belongs to the
            utterance that the next ``finalize`` ends.
        at_ms: Audio the session had received when the gap came, ms (where it lies in the decoded audio).
        ms: Audio withheld, ms.

    """

    finalizes_before: int
    at_ms: float
    ms: float


class AudioPositions:
    """Where a session's results are in its audio (the audio the client sent plus the gaps it reported).

    Finals carry the utterance's exact length (samples), decoded frames only 10 ms resolution, so positions are
    the sum of exact utterance lengths plus the current utterance's decoded frames (no error accumulates over
    utterances). A gap (audio the client withheld between turns) counts in the utterance that the next
    ``finalize`` after it ends, at the point where it came: words after it move by its length.
    """

    def __init__(self) -> None:
        self._base_ms = 0.0
        self._decoded_at_final_ms = 0.0
        self._finals = 0  # finals answering a finalize, sent so far
        self._gaps: list[_Gap] = []  # not yet counted in a final
        self._counted_gap_ms = 0.0  # gaps counted in finals: every one lies before the current utterance

    def gap(self, finalizes_before: int, at_ms: float, ms: float) -> None:
        """The client withheld ``ms`` of audio after ``at_ms`` of received audio and ``finalizes_before`` finalizes."""
        if ms > 0:
            self._gaps.append(_Gap(finalizes_before, at_ms, ms))

    def _open_gaps(self, decoded_ms: float) -> list[_Gap]:
        """The gaps of the utterance decoded now that lie before ``decoded_ms`` of decoded audio."""
        return [g for g in self._gaps if g.finalizes_before <= self._finals and g.at_ms <= decoded_ms]

    def position_ms(self, stream: ASRStream) -> float:
        """Session audio decoded so far, ms: exact up to the last final, then 10 ms resolution."""
        decoded_ms = stream.audio_seconds * 1000.0
        gaps_ms = sum(g.ms for g in self._open_gaps(decoded_ms))
        return self._base_ms + max(0.0, decoded_ms - self._decoded_at_final_ms) + gaps_ms

    def at_ms(self, decoded_ms: float) -> float:
        """A point of the current utterance's decoded audio (ms from the stream's first sample) in session ms."""
        gaps_ms = sum(g.ms for g in self._open_gaps(decoded_ms))
        return self._base_ms + max(0.0, decoded_ms - self._decoded_at_final_ms) + gaps_ms

    def final_message(
        self, update: Transcript, stream: ASRStream, word_timings: bool = False
    ) -> FinalMessage:
        """The ``final`` message for ``update``, with its words if ``word_timings``.

        Later positions count from the end of its utterance.
        """
        decoded_ms = stream.audio_seconds * 1000.0
        utterance_ms = max(0.0, decoded_ms - self._decoded_at_final_ms)
        if update.utterance_audio_ms is not None:  # the utterance's exact length (every engine final has it)
            utterance_ms = update.utterance_audio_ms
        end_ms = self._decoded_at_final_ms + utterance_ms  # where the utterance ends in the decoded audio
        # A finalize's utterance holds every gap read before that finalize; a forced final only those before its cut.
        mine = [
            g for g in self._gaps
            if g.finalizes_before <= self._finals and (not update.forced or g.at_ms < end_ms)
        ]  # fmt: skip
        words = update.words
        if word_timings and (self._counted_gap_ms or mine):
            words = tuple(self._shifted(w, mine) for w in words)
        gap_ms = sum(g.ms for g in mine)
        self._gaps = [g for g in self._gaps if g not in mine]
        self._counted_gap_ms += gap_ms
        self._base_ms += utterance_ms + gap_ms
        # A forced final ends before the audio decoded so far (the speech goes on past its cut).
        self._decoded_at_final_ms = end_ms if update.forced else decoded_ms
        if not update.forced:
            self._finals += 1
        return FinalMessage(
            utterance=update.utterance,
            text=update.text,
            latency_ms=update.latency_ms,
            session_audio_ms=self._base_ms,
            utterance_audio_ms=utterance_ms + gap_ms,
            ttf_ms=update.ttf_ms or 0.0,
            step_ms=update.step_ms,
            words=words_to_wire(words) if word_timings else None,
            confidence=update.confidence if word_timings else None,
            forced=True if update.forced else None,
        )

    def _shifted(self, word: WordTiming, gaps: list[_Gap]) -> WordTiming:
        """``word`` (decoded-audio times) moved by the gaps before it (all gaps of earlier utterances included)."""
        within = sum(g.ms for g in gaps if g.at_ms <= word.start_ms)  # this utterance's gaps before the word
        shift = self._counted_gap_ms + within
        return dataclasses.replace(
            word,
            start_ms=word.start_ms + shift,
            end_ms=word.end_ms + shift,
            utterance_start_ms=word.utterance_start_ms + within,
            utterance_end_ms=word.utterance_end_ms + within,
        )
