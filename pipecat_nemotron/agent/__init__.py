"""The voice agent: pipeline assembly, turn end, the runner hooks for bots, and WAV input for offline runs.

Names load on first access.
"""

from __future__ import annotations

from pipecat_nemotron.runtime.lazy import lazy_exports

_EXPORTS = {
    "AgentSettings": "pipecat_nemotron.agent.settings",
    "VoiceAgent": "pipecat_nemotron.agent.assembly",
    "build_voice_agent": "pipecat_nemotron.agent.assembly",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
