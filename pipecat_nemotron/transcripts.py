"""A pipeline processor that collects (and optionally prints) transcripts with their per-utterance latencies."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TextIO

from pipecat.frames.frames import Frame, InterimTranscriptionFrame, MetricsFrame, TranscriptionFrame
from pipecat.metrics.metrics import TTFBMetricsData
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from pipecat_nemotron.metrics import ASRFinalizeMetricsData


@dataclass
class UtteranceRecord:
    """One finalized utterance.

    Attributes:
        text: Final transcript.
        ttfs_ms: Pipecat's TTFS (speech end to final transcript), ms; None if not measured.
        finalize_ms: Pure ASR finalize time (finalize call to final text), ms; None if not reported.

    """

    text: str
    ttfs_ms: float | None = None
    finalize_ms: float | None = None


class TranscriptCollector(FrameProcessor):
    """Records final transcripts with their TTFS and finalize times; prints them when ``out`` is given.

    Place it after the STT service. Frames pass through unchanged.

    Args:
        stt_name: Name of the STT processor whose TTFS metrics to attribute (``stt.name``).
        out: Stream to print interim/final lines to (None: silent).
        show_interims: Also print interim transcripts (overwriting one console line).

    """

    def __init__(
        self, stt_name: str, out: TextIO | None = None, show_interims: bool = True, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        self.stt_name = stt_name
        self.out = out
        self.show_interims = show_interims
        self.utterances: list[UtteranceRecord] = []
        self._ttfs_ms: float | None = None

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """Record and pass the frame on."""
        await super().process_frame(frame, direction)
        if isinstance(frame, MetricsFrame):
            for data in frame.data:
                if isinstance(data, ASRFinalizeMetricsData) and self.utterances:
                    self.utterances[-1].finalize_ms = data.value * 1000.0
                    self._print_last()
                elif isinstance(data, TTFBMetricsData) and data.processor == self.stt_name and data.value > 0:
                    # (value 0 is the placeholder every processor reports at pipeline start)
                    self._ttfs_ms = data.value * 1000.0
        elif isinstance(frame, TranscriptionFrame):
            self.utterances.append(UtteranceRecord(frame.text, ttfs_ms=self._ttfs_ms))
            self._ttfs_ms = None
        elif isinstance(frame, InterimTranscriptionFrame) and self.out is not None and self.show_interims:
            self.out.write(f"\r  … {frame.text[-100:]}\033[K")
            self.out.flush()
        await self.push_frame(frame, direction)

    def _print_last(self) -> None:
        if self.out is None:
            return
        u = self.utterances[-1]
        ttfs = f"{u.ttfs_ms:.0f} ms" if u.ttfs_ms is not None else "n/a"
        fin = f"{u.finalize_ms:.1f} ms" if u.finalize_ms is not None else "n/a"
        self.out.write(f"\r[final] {u.text}\033[K\n        TTFS {ttfs} · ASR finalize {fin}\n")
        self.out.flush()


def print_latency_summary(
    utterances: list[UtteranceRecord], out: TextIO = sys.stdout
) -> dict[str, dict[str, float]]:
    """Print and return p50/p90/p99 of TTFS and finalize time over ``utterances``."""
    from pipecat_nemotron.metrics import percentile

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
