"""Per-turn latency records and their statistics: percentiles, per-stage summaries, the JSONL file.

Plain Python (no Pipecat, no NumPy): :class:`~pipecat_nemotron.observers.metrics.VoiceLatencyObserver` builds the
records, :mod:`pipecat_nemotron.observers.report` plots them, and :func:`~pipecat_nemotron.runtime.stats.percentile` is the package's one percentile
(NumPy's default interpolation), used by the STT services' TTFS estimate too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from pipecat_nemotron.runtime.stats import percentile

__all__ = [
    "STAGES",
    "STAGE_LABELS",
    "EagerStats",
    "StageStats",
    "TurnLatency",
    "format_eager",
    "format_summary",
    "load_turns",
    "percentile",
    "summarize",
    "summarize_eager",
]

STAGES: tuple[str, ...] = ("ttfs_ms", "asr_finalize_ms", "llm_ttfb_ms", "tts_ttfb_ms", "v2v_ms")
"""The per-turn stage fields of :class:`TurnLatency`, in pipeline order."""

STAGE_LABELS: dict[str, str] = {
    "ttfs_ms": "STT TTFS (speech end -> final)",
    "asr_finalize_ms": "ASR finalize",
    "llm_ttfb_ms": "LLM TTFB",
    "tts_ttfb_ms": "TTS TTFB",
    "v2v_ms": "voice-to-voice",
}
"""Human-readable names of :data:`STAGES`."""

_PERCENTILES = (50.0, 90.0, 99.0)


@dataclass
class TurnLatency:
    """Latency of one user turn: one JSON line of ``turns.jsonl``.

    Timestamps are Unix seconds (``time.time()``); durations are milliseconds. A
    stage that did not run or report in this turn is ``None``.

    Attributes:
        turn: 1-based index of the turn in the session.
        speech_end_ts: When the user stopped speaking (VAD decision minus ``stop_secs``).
        vad_stop_ts: When the VAD decided speech had ended.
        vad_stop_secs: Silence the VAD waited before deciding, seconds.
        transcript_ts: When the last transcript before the LLM request was observed.
        bot_started_ts: When the bot started speaking (``BotStartedSpeakingFrame``).
        ttfs_ms: Speech end to final transcript (STT TTFB metric).
        asr_finalize_ms: Pure ASR finalize time (:class:`~pipecat_nemotron.observers.metrics.ASRFinalizeMetricsData`).
        llm_ttfb_ms: LLM request to first token (LLM TTFB metric).
        tts_ttfb_ms: TTS request to first audio (TTS TTFB metric).
        v2v_ms: Speech end to bot speaking (Pipecat's voice-to-voice).
        breakdown_ms: Pipecat's named contributions to ``v2v_ms`` (endpointing_wait,
            transcription, turn_detection, llm_inference, speech_synthesis,
            output_transport, pipeline, ...), in time order; they sum to ``v2v_ms``.
        processors: Processor name that reported each of ``stt``/``llm``/``tts``.
        transcript: The user's words; only when the observer has ``record_text=True``.
        eager: The STT predicted this turn's end early (an ``EagerTranscriptionFrame``, eager end of turn).
        eager_outcome: ``"kept"`` (the reply spoken is the one generated from the prediction), ``"cancelled"``
            (every prediction was withdrawn or did not match the committed transcript) or None (no prediction).
        eager_lead_ms: From the last prediction to the committed final transcript (how early the LLM started),
            ms; None without a prediction standing at the commit.
        eager_predictions: Predictions made in the turn (each started an LLM request).
        eager_cancelled: Predictions withdrawn or mismatched (LLM requests wasted).

    """

    turn: int
    speech_end_ts: float | None = None
    vad_stop_ts: float | None = None
    vad_stop_secs: float | None = None
    transcript_ts: float | None = None
    bot_started_ts: float | None = None
    ttfs_ms: float | None = None
    asr_finalize_ms: float | None = None
    llm_ttfb_ms: float | None = None
    tts_ttfb_ms: float | None = None
    v2v_ms: float | None = None
    breakdown_ms: dict[str, float] = field(default_factory=dict)
    processors: dict[str, str] = field(default_factory=dict)
    transcript: str | None = None
    eager: bool = False
    eager_outcome: str | None = None
    eager_lead_ms: float | None = None
    eager_predictions: int = 0
    eager_cancelled: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Return the record as a JSON-ready dict (``transcript`` omitted when None)."""
        values = asdict(self)
        if values["transcript"] is None:
            del values["transcript"]
        return values

    def to_json(self) -> str:
        """Return the record as one compact JSON line (no trailing newline)."""
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TurnLatency:
        """Build a record from a dict, ignoring unknown keys and defaulting missing ones.

        Args:
            values: A decoded JSON line.

        Returns:
            The record.

        Raises:
            ValueError: If ``turn`` is missing.

        """
        known = {f.name for f in fields(cls)}
        if "turn" not in values:
            raise ValueError("turn record has no 'turn' field")
        kwargs = {k: v for k, v in values.items() if k in known}
        for stage in (*STAGES, "eager_lead_ms"):
            if kwargs.get(stage) is not None:
                kwargs[stage] = float(kwargs[stage])
        return cls(**kwargs)

    def stage(self, name: str) -> float | None:
        """Value of one of :data:`STAGES`, in ms, or None."""
        return getattr(self, name)


@dataclass(frozen=True)
class StageStats:
    """Distribution of one stage over turns, in milliseconds.

    Attributes:
        stage: One of :data:`STAGES`.
        count: Turns in which the stage reported a value.
        p50: Median, or None when ``count`` is 0.
        p90: 90th percentile, or None.
        p99: 99th percentile, or None.
        mean: Mean, or None.
        min: Minimum, or None.
        max: Maximum, or None.

    """

    stage: str
    count: int
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    mean: float | None = None
    min: float | None = None
    max: float | None = None


def summarize(turns: Iterable[TurnLatency], stages: Sequence[str] = STAGES) -> dict[str, StageStats]:
    """p50/p90/p99 (and mean/min/max) per stage, skipping turns where a stage is None.

    Args:
        turns: Turn records.
        stages: Which stage fields to summarise.

    Returns:
        Stage name to statistics, in ``stages`` order; a stage with no values has
        ``count == 0`` and None statistics.

    """
    turns = list(turns)
    result: dict[str, StageStats] = {}
    for stage in stages:
        values = [v for t in turns if (v := t.stage(stage)) is not None and math.isfinite(v)]
        if not values:
            result[stage] = StageStats(stage=stage, count=0)
            continue
        p50, p90, p99 = (percentile(values, q) for q in _PERCENTILES)
        result[stage] = StageStats(
            stage=stage,
            count=len(values),
            p50=p50,
            p90=p90,
            p99=p99,
            mean=sum(values) / len(values),
            min=min(values),
            max=max(values),
        )
    return result


def format_summary(stats: Mapping[str, StageStats]) -> str:
    """Render statistics as a fixed-width table (ms).

    Args:
        stats: Output of :func:`summarize`.

    Returns:
        A multi-line table with one row per stage.

    """

    def cell(value: float | None) -> str:
        return f"{value:8.1f}" if value is not None else f"{'-':>8}"

    width = max([len(STAGE_LABELS.get(s, s)) for s in stats] + [5])
    lines = [f"{'stage':<{width}}  {'n':>4}  {'p50':>8}  {'p90':>8}  {'p99':>8}  {'max':>8}   (ms)"]
    for name, s in stats.items():
        lines.append(
            f"{STAGE_LABELS.get(name, name):<{width}}  {s.count:>4}  {cell(s.p50)}  {cell(s.p90)}  "
            f"{cell(s.p99)}  {cell(s.max)}"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class EagerStats:
    """What the eager end of turn did over a set of turns.

    Attributes:
        turns: Turns.
        eager_turns: Turns with at least one prediction.
        kept: Turns whose spoken reply was generated from a prediction.
        predictions: Predictions (each started an LLM request).
        cancelled: Predictions withdrawn or mismatched (each wasted an LLM request).
        lead: Distribution of the lead time (last prediction to committed final) over the kept turns, ms.

    """

    turns: int
    eager_turns: int
    kept: int
    predictions: int
    cancelled: int
    lead: StageStats

    @property
    def cancelled_share(self) -> float | None:
        """Share of the predictions cancelled, in [0, 1] (None without predictions)."""
        return self.cancelled / self.predictions if self.predictions else None

    @property
    def wasted_per_turn(self) -> float | None:
        """LLM requests wasted per turn (None without turns)."""
        return self.cancelled / self.turns if self.turns else None


def summarize_eager(turns: Iterable[TurnLatency]) -> EagerStats:
    """Count the eager end of turn's predictions, cancellations and kept replies, and its lead time (ms)."""
    turns = list(turns)
    kept = [t for t in turns if t.eager_outcome == "kept"]
    lead = summarize(
        [TurnLatency(turn=t.turn, v2v_ms=t.eager_lead_ms) for t in kept if t.eager_lead_ms is not None],
        ("v2v_ms",),
    )["v2v_ms"]
    return EagerStats(
        turns=len(turns),
        eager_turns=sum(1 for t in turns if t.eager),
        kept=len(kept),
        predictions=sum(t.eager_predictions for t in turns),
        cancelled=sum(t.eager_cancelled for t in turns),
        lead=StageStats(
            "eager_lead_ms", lead.count, lead.p50, lead.p90, lead.p99, lead.mean, lead.min, lead.max
        ),
    )


def format_eager(stats: EagerStats) -> str:
    """One line: predictions, kept replies, cancelled share, wasted LLM requests per turn, lead time p50 (ms)."""
    if not stats.predictions:
        return "eager end of turn: no predictions"
    lead = f", lead p50 {stats.lead.p50:.0f} ms" if stats.lead.p50 is not None else ""
    return (
        f"eager end of turn: {stats.predictions} predictions in {stats.eager_turns}/{stats.turns} turns, "
        f"{stats.kept} kept, {stats.cancelled} cancelled ({100 * (stats.cancelled_share or 0):.0f}%), "
        f"{stats.wasted_per_turn or 0:.2f} wasted LLM requests per turn{lead}"
    )


def load_turns(path: str | Path) -> list[TurnLatency]:
    """Read a JSONL file written by :class:`~pipecat_nemotron.observers.metrics.VoiceLatencyObserver`.

    Args:
        path: The file; blank lines are skipped.

    Returns:
        The records in file order.

    Raises:
        ValueError: If a line is not a JSON object with a ``turn`` field (names the line).

    """
    turns: list[TurnLatency] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                values = json.loads(line)
                if not isinstance(values, dict):
                    raise ValueError("not a JSON object")
                turns.append(TurnLatency.from_dict(values))
            except (ValueError, TypeError) as e:
                raise ValueError(f"{path}:{number}: bad turn record: {e}") from e
    return turns
