"""What a run measures and shows: voice-to-voice latency per turn, its statistics and plots, transcripts.

Names load on first access.
"""

from __future__ import annotations

from pipecat_nemotron.runtime.lazy import lazy_exports

_EXPORTS = {
    "VoiceLatencyObserver": "pipecat_nemotron.observers.metrics",
    "TurnLatency": "pipecat_nemotron.observers.latency_stats",
    "TranscriptCollector": "pipecat_nemotron.observers.transcripts",
    "UtteranceRecord": "pipecat_nemotron.observers.transcripts",
    "print_latency_summary": "pipecat_nemotron.observers.transcripts",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
