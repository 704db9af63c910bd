"""The streaming ASR engine: model loading, per-stream state and the batching scheduler. Imports no Pipecat.

Names load on first access: importing this package (or a plain-Python module of it such as ``types`` or
``config``) does not import torch or NeMo; :class:`NemotronEngine` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipecat_nemotron.runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from pipecat_nemotron.asr.config import DEFAULT_MODEL, LATENCY_MODES, EngineConfig
    from pipecat_nemotron.asr.engine import EngineInfo, NemotronEngine
    from pipecat_nemotron.asr.errors import (
        BoostingUnavailableError,
        BoostPhraseError,
        CapacityError,
        EndOfUtteranceUnavailableError,
        EngineNotRunningError,
        InvalidAudioError,
        ModelLoadError,
        NemotronEngineError,
        StreamClosedError,
        StreamFailedError,
    )
    from pipecat_nemotron.asr.scheduler import StepStats
    from pipecat_nemotron.asr.stream import ASRStream
    from pipecat_nemotron.asr.types import Transcript, WordTiming

_EXPORTS = {
    "DEFAULT_MODEL": "pipecat_nemotron.asr.config",
    "LATENCY_MODES": "pipecat_nemotron.asr.config",
    "EngineConfig": "pipecat_nemotron.asr.config",
    "EngineInfo": "pipecat_nemotron.asr.engine",
    "NemotronEngine": "pipecat_nemotron.asr.engine",
    "BoostPhraseError": "pipecat_nemotron.asr.errors",
    "BoostingUnavailableError": "pipecat_nemotron.asr.errors",
    "CapacityError": "pipecat_nemotron.asr.errors",
    "EndOfUtteranceUnavailableError": "pipecat_nemotron.asr.errors",
    "EngineNotRunningError": "pipecat_nemotron.asr.errors",
    "InvalidAudioError": "pipecat_nemotron.asr.errors",
    "ModelLoadError": "pipecat_nemotron.asr.errors",
    "NemotronEngineError": "pipecat_nemotron.asr.errors",
    "StreamClosedError": "pipecat_nemotron.asr.errors",
    "StreamFailedError": "pipecat_nemotron.asr.errors",
    "StepStats": "pipecat_nemotron.asr.scheduler",
    "ASRStream": "pipecat_nemotron.asr.stream",
    "Transcript": "pipecat_nemotron.asr.types",
    "WordTiming": "pipecat_nemotron.asr.types",
}

__all__ = [
    "ASRStream",
    "BoostPhraseError",
    "BoostingUnavailableError",
    "CapacityError",
    "DEFAULT_MODEL",
    "EndOfUtteranceUnavailableError",
    "EngineConfig",
    "EngineInfo",
    "EngineNotRunningError",
    "InvalidAudioError",
    "LATENCY_MODES",
    "ModelLoadError",
    "NemotronEngine",
    "NemotronEngineError",
    "StepStats",
    "StreamClosedError",
    "StreamFailedError",
    "Transcript",
    "WordTiming",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
