"""The metric an STT service of this package pushes after finalizing an utterance: pure ASR finalize time.

:class:`~pipecat_nemotron.observers.metrics.VoiceLatencyObserver` reads it as the ``asr_finalize_ms`` leg of a
turn; generic Pipecat consumers (``MetricsLogObserver``, RTVI) see ordinary processing time of the STT processor.
"""

from __future__ import annotations

import math

from pipecat.frames.frames import MetricsFrame
from pipecat.metrics.metrics import ProcessingMetricsData

__all__ = ["ASR_FINALIZE_METRIC", "ASRFinalizeMetricsData", "asr_finalize_metrics_frame", "is_asr_finalize_metric"]

ASR_FINALIZE_METRIC = "asr_finalize"
"""Marker in :attr:`ASRFinalizeMetricsData.metric` (survives JSON serialisation)."""


class ASRFinalizeMetricsData(ProcessingMetricsData):
    """Model time to finalize one utterance in the in-process ASR.

    A :class:`~pipecat.metrics.metrics.ProcessingMetricsData` subclass, so generic
    consumers (``MetricsLogObserver``, RTVI) report it as processing time of the STT
    processor, while :class:`VoiceLatencyObserver` recognises it by type (or, after
    serialisation, by ``metric == "asr_finalize"``).

    Parameters
    ----------
        value: Finalize time in seconds (Pipecat's unit for processing metrics).
        metric: Always :data:`ASR_FINALIZE_METRIC`.

    """

    metric: str = ASR_FINALIZE_METRIC


def asr_finalize_metrics_frame(processor: str, model: str | None, value_ms: float) -> MetricsFrame:
    """Build the ``MetricsFrame`` an STT service pushes after finalizing an utterance.

    Push it downstream after the VAD stop and before (or right after) the final
    ``TranscriptionFrame``; the observer attributes it to the current user turn.

    Args:
        processor: Name of the pushing processor (``self.name``).
        model: Model name, e.g. ``"nvidia/nemotron-speech-streaming-en-0.6b"``.
        value_ms: Finalize time in milliseconds (flush + last decode), >= 0.

    Returns:
        A ``MetricsFrame`` holding one :class:`ASRFinalizeMetricsData` (in seconds).

    Raises:
        ValueError: If ``value_ms`` is negative or not finite.

    """
    if not math.isfinite(value_ms) or value_ms < 0:
        raise ValueError(f"ASR finalize time must be a finite number of ms >= 0, got {value_ms!r}")
    return MetricsFrame(
        data=[ASRFinalizeMetricsData(processor=processor, model=model, value=value_ms / 1000.0)]
    )


def is_asr_finalize_metric(data: object) -> bool:
    """True for an :class:`ASRFinalizeMetricsData` (or its serialised form, ``metric == "asr_finalize"``)."""
    if isinstance(data, ASRFinalizeMetricsData):
        return True
    return isinstance(data, ProcessingMetricsData) and getattr(data, "metric", None) == ASR_FINALIZE_METRIC
