"""pipecat-nemotron: NVIDIA Nemotron Speech streaming ASR running in process for Pipecat voice agents.

Heavy modules (Pipecat services, NeMo) load on first attribute access, so ``import pipecat_nemotron`` is cheap.
"""

from __future__ import annotations

from pipecat_nemotron.runtime.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "NemotronSTTService": "pipecat_nemotron.stt",
    "NemotronSTTSettings": "pipecat_nemotron.stt",
    "NemotronSTTUnavailableError": "pipecat_nemotron.stt.ready",
    "NemotronEngine": "pipecat_nemotron.asr",
    "EngineConfig": "pipecat_nemotron.asr",
    "default_asr_model": "pipecat_nemotron.models",
    "TINY_MODEL_PATH": "pipecat_nemotron.models",
    "MagpieTTSService": "pipecat_nemotron.tts",
    "create_nemotron_llm": "pipecat_nemotron.llm",
    "NemotronLLMSettings": "pipecat_nemotron.llm",
    "VoiceLatencyObserver": "pipecat_nemotron.observers",
    "Transcript": "pipecat_nemotron.asr.types",
}

__all__ = ["__version__", *_EXPORTS]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
