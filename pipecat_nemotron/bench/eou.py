"""Where a model's end-of-utterance events fall in multi-utterance audio: after each utterance, or inside one.

A session is held-out utterances, each after a lead silence and followed by a gap, some with a pause inserted at a
word gap inside the sentence (:func:`~pipecat_nemotron.bench.eager.insert_pause`, as ``bench turns`` does). The
whole session streams through one engine stream opened with ``eou=True`` (no finalize until its end: the model's
own decision, not the VAD's), and each ``eou`` record's ``eou_ms`` is placed against the utterances' speech spans:

- **inside**: between an utterance's first and last sound (less :data:`END_SLACK_MS`): the model ended a turn the
  user had not finished (at a pause inside the sentence, for a paused one);
- **after**: the first event after an utterance's last sound and before the next one starts: its delay
  (``eou_ms`` minus the speech end) is the model's end-of-utterance latency in audio time;
- **missed**: no event between an utterance's end and the next one's start.

Used by ``scripts/make_tiny_eou_model.py eval`` and by the tiny EOU model's golden test.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE
from pipecat_nemotron.bench.eager import insert_pause

#: An event this close before an utterance's last sound is not inside it (frame rounding), ms.
END_SLACK_MS = 100.0


@dataclass(frozen=True)
class Span:
    """One utterance of a session: its speech, ms from the session's first sample, and whether it is paused."""

    start_ms: float
    end_ms: float
    paused: bool
    text: str | None = None


@dataclass(frozen=True)
class Placement:
    """Where one utterance's events fell.

    Attributes:
        span: The utterance.
        inside: Events inside its speech (ms).
        delay_ms: The first event after its speech, ms after its last sound (None: missed).

    """

    span: Span
    inside: tuple[float, ...]
    delay_ms: float | None


def speech_span(audio: np.ndarray, window: int = 160) -> tuple[float, float]:
    """First and last loud 10 ms of an int16 clip (a tenth of its loud level), ms."""
    n = audio.size // window
    rms = np.sqrt((audio[: n * window].astype(np.float64) ** 2).reshape(n, window).mean(axis=1))
    loud = np.flatnonzero(rms >= 0.1 * np.percentile(rms, 95))
    if not loud.size:
        return 0.0, 1000.0 * audio.size / MODEL_SAMPLE_RATE
    return 10.0 * loud[0], 10.0 * (loud[-1] + 1)


def build_session(
    clips: Sequence[tuple[np.ndarray, str | None]],
    rng: random.Random,
    pause_share: float = 0.5,
    pause_ms: tuple[float, float] = (300.0, 900.0),
    lead_s: float = 0.5,
    gap_s: float = 2.0,
) -> tuple[np.ndarray, list[Span]]:
    """One session: each int16 clip after ``lead_s`` of silence and before ``gap_s``, a share of them paused.

    Args:
        clips: (int16 16 kHz audio, text) per utterance.
        rng: Picks the paused clips and their pause lengths.
        pause_share: Share of clips with a pause inside the sentence.
        pause_ms: Range of the pause, ms (the word gap's own silence counted).
        lead_s: Silence before each utterance, s.
        gap_s: Silence after each utterance, s.

    """
    lead = np.zeros(int(lead_s * MODEL_SAMPLE_RATE), np.int16)
    gap = np.zeros(int(gap_s * MODEL_SAMPLE_RATE), np.int16)
    pieces: list[np.ndarray] = []
    spans: list[Span] = []
    at_ms = 0.0
    for audio, text in clips:
        paused = rng.random() < pause_share
        if paused:
            audio = insert_pause(audio, rng.uniform(*pause_ms))
        first, last = speech_span(audio)
        at_ms += 1000.0 * lead.size / MODEL_SAMPLE_RATE
        spans.append(Span(at_ms + first, at_ms + last, paused, text))
        pieces += [lead, audio, gap]
        at_ms += 1000.0 * (audio.size + gap.size) / MODEL_SAMPLE_RATE
    return np.concatenate(pieces), spans


async def eou_times(engine: Any, audio: np.ndarray, latency_ms: int = 160) -> list[float]:
    """Every ``eou_ms`` one stream reports for ``audio`` (int16, 16 kHz), finalized only at its end."""
    stream = engine.open_stream(latency_ms=latency_ms, eou=True)
    try:
        await stream.push(audio)
        stream.request_final()
        times: list[float] = []
        async for update in stream.updates():
            if update.kind == "eou" and update.eou_ms is not None:
                times.append(float(update.eou_ms))
            if update.is_final and not update.forced:
                break
        return times
    finally:
        await stream.close()


def place(spans: Sequence[Span], times: Sequence[float]) -> list[Placement]:
    """Each utterance's events: inside its speech, and the first after it (before the next utterance starts)."""
    out = []
    for i, span in enumerate(spans):
        nxt = spans[i + 1].start_ms if i + 1 < len(spans) else float("inf")
        inside = tuple(t for t in times if span.start_ms < t < span.end_ms - END_SLACK_MS)
        after = [t for t in times if span.end_ms - END_SLACK_MS <= t < nxt]
        out.append(Placement(span, inside, after[0] - span.end_ms if after else None))
    return out


def summarize(placements: Sequence[Placement]) -> dict[str, Any]:
    """Counts and delays: utterances, ended (an event after), missed, cut inside (all; paused ones), delay p50/p90."""
    delays = sorted(p.delay_ms for p in placements if p.delay_ms is not None)
    paused = [p for p in placements if p.span.paused]

    def pct(q: float) -> float | None:
        return round(float(np.percentile(delays, q)), 1) if delays else None

    return {
        "utterances": len(placements),
        "ended": len(delays),
        "missed": sum(p.delay_ms is None for p in placements),
        "inside": sum(bool(p.inside) for p in placements),
        "paused": len(paused),
        "inside_paused": sum(bool(p.inside) for p in paused),
        "delay_p50_ms": pct(50),
        "delay_p90_ms": pct(90),
    }
