"""An observer that collects (and optionally prints) transcripts with their per-utterance latencies."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    ErrorFrame,
    InterimTranscriptionFrame,
    MetricsFrame,
    StartFrame,
    TranscriptionFrame,
)
from pipecat.metrics.metrics import TTFBMetricsData
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.processors.frame_processor import FrameDirection

from pipecat_nemotron.asr.types import Transcript
from pipecat_nemotron.stt.metrics import is_asr_finalize_metric


def _is_terminal(out: TextIO) -> bool:
    """Whether ``out`` is a terminal (escape codes and overwritten lines only make sense there)."""
    try:
        return out.isatty()
    except (AttributeError, ValueError):  # a closed or file-like stream without isatty
        return False


@dataclass
class UtteranceRecord:
    """One finalized utterance.

    Attributes:
        text: Final transcript.
        ttfs_ms: Pipecat's TTFS (speech end to final transcript), ms; None if not measured.
        finalize_ms: Pure ASR finalize time (finalize call to final text), ms; None if not reported.
        result: The STT service's words with timings and confidence (``TranscriptionFrame.result``), if any.

    """

    text: str
    ttfs_ms: float | None = None
    finalize_ms: float | None = None
    result: Transcript | None = None


class TranscriptCollector(BaseObserver):
    """Records final transcripts with their TTFS and finalize times; prints them when ``out`` is given.

    Attach it to the pipeline worker as an observer (``PipelineWorker(..., observers=[collector])``, or
    ``build_voice_agent(observers=[collector])``). An observer sees each frame when the STT service pushes it,
    in the order the service pushed them: the TTFS metric, then the ``TranscriptionFrame``, then the ASR
    finalize metric of the same utterance. A processor placed after the STT would not: metrics travel in
    system frames, which overtake the transcript queued behind audio frames, so a processor could attribute a
    finalize time to the previous utterance. Each final is printed once its finalize time is known (or at
    once when the pipeline has metrics off), so finals print in order, each with its own numbers.

    Args:
        stt_name: Name of the STT processor whose frames and metrics to record (``stt.name``).
        out: Stream to print interim/final lines to (None: silent). On a terminal, interims overwrite one line;
            elsewhere (a file, a pipe) only plain lines are written: finals and errors, no interims, no escape
            codes.
        show_interims: Also print interim transcripts (overwriting one console line; terminals only).
        on_final: Called with each :class:`UtteranceRecord` once its numbers are known (e.g. a bot's log line).
        show_words: Also print each final's words with their start and end (s from the stream's start) and
            confidence, and the utterance's confidence.

    """

    def __init__(
        self,
        stt_name: str,
        out: TextIO | None = None,
        show_interims: bool = True,
        on_final: Callable[[UtteranceRecord], None] | None = None,
        show_words: bool = False,
    ) -> None:
        super().__init__(observe_every_push=False)
        self.stt_name = stt_name
        self.out = out
        self.show_interims = show_interims
        self.on_final = on_final
        self.show_words = show_words
        self.utterances: list[UtteranceRecord] = []
        #: The STT service's errors (``ErrorFrame.error``), in order: a session with any lost something.
        self.errors: list[str] = []
        self._terminal = out is not None and _is_terminal(out)
        self._metrics_enabled = True
        self._ttfs_ms: float | None = None
        self._awaiting_finalize: UtteranceRecord | None = None

    async def on_push_frame(self, data: FramePushed) -> None:
        """Record the STT service's transcripts and metrics, in the order it pushed them."""
        frame = data.frame
        if isinstance(frame, ErrorFrame):
            if getattr(data.source, "name", None) == self.stt_name:
                self._on_error(frame)
            return
        if data.direction != FrameDirection.DOWNSTREAM:
            return
        if isinstance(frame, StartFrame):
            # The pipeline's metrics setting, as every processor was set up with it.
            self._metrics_enabled = bool(getattr(data.source, "metrics_enabled", True))
        elif isinstance(frame, (EndFrame, CancelFrame)):
            self._flush()
        elif getattr(data.source, "name", None) != self.stt_name:
            return
        elif isinstance(frame, MetricsFrame):
            self._on_metrics(frame)
        elif isinstance(frame, TranscriptionFrame):
            self._flush()
            result = frame.result if isinstance(frame.result, Transcript) else None
            record = UtteranceRecord(frame.text, ttfs_ms=self._ttfs_ms, result=result)
            self._ttfs_ms = None
            self.utterances.append(record)
            self._awaiting_finalize = record
            if not self._metrics_enabled:
                self._flush()
        elif isinstance(frame, InterimTranscriptionFrame) and self._terminal and self.show_interims:
            assert self.out is not None
            self.out.write(f"\r  … {frame.text[-100:]}\033[K")
            self.out.flush()

    def _on_metrics(self, frame: MetricsFrame) -> None:
        for metric in frame.data:
            if is_asr_finalize_metric(metric) and self._awaiting_finalize is not None:
                self._awaiting_finalize.finalize_ms = metric.value * 1000.0
                self._flush()
            elif isinstance(metric, TTFBMetricsData) and metric.processor == self.stt_name and metric.value > 0:
                # (value 0 is the placeholder every processor reports at pipeline start)
                self._ttfs_ms = metric.value * 1000.0

    def _line(self, text: str) -> str:
        """``text`` as a line of its own: on a terminal, over the interim line (cleared to its end)."""
        return f"\r{text}\033[K\n" if self._terminal else f"{text}\n"

    def _on_error(self, frame: ErrorFrame) -> None:
        self.errors.append(frame.error)
        if self.out is not None:
            self.out.write(self._line(f"[error] {frame.error}"))
            self.out.flush()

    def _flush(self) -> None:
        """Print the final awaiting its finalize time (it is not coming, or has come)."""
        record, self._awaiting_finalize = self._awaiting_finalize, None
        if record is None:
            return
        if self.on_final is not None:
            self.on_final(record)
        if self.out is None:
            return
        ttfs = f"{record.ttfs_ms:.0f} ms" if record.ttfs_ms is not None else "n/a"
        fin = f"{record.finalize_ms:.1f} ms" if record.finalize_ms is not None else "n/a"
        self.out.write(self._line(f"[final] {record.text}") + f"        TTFS {ttfs} · ASR finalize {fin}\n")
        if self.show_words and record.result is not None and record.result.words:
            confidence = record.result.confidence or 0.0
            self.out.write(f"        confidence {confidence:.2f}; words (start, end, confidence):\n")
            self.out.write("".join(f"        {line}\n" for line in record.result.format_words().splitlines()))
        self.out.flush()


def print_latency_summary(
    utterances: list[UtteranceRecord], out: TextIO = sys.stdout
) -> dict[str, dict[str, float]]:
    """Print and return p50/p90/p99 of TTFS and finalize time over ``utterances``."""
    from pipecat_nemotron.observers.latency_stats import percentile

    summary: dict[str, dict[str, float]] = {}
    for name, values in (
        ("ttfs_ms", [u.ttfs_ms for u in utterances if u.ttfs_ms is not None]),
        ("finalize_ms", [u.finalize_ms for u in utterances if u.finalize_ms is not None]),
    ):
        if values:
            summary[name] = {f"p{q}": percentile(values, q) for q in (50, 90, 99)} | {"n": float(len(values))}
    for name, s in summary.items():
        out.write(
            f"{name:12s} n={int(s['n']):3d}  p50 {s['p50']:7.1f}  p90 {s['p90']:7.1f}  p99 {s['p99']:7.1f}\n"
        )
    return summary
