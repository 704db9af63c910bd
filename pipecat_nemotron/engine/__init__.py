"""The streaming ASR engine: model loading, per-stream state and the batching scheduler. Imports no Pipecat.

Names load on first access: importing this package (or a plain-Python module of it such as ``types`` or
``config``) does not import torch or NeMo; :class:`NemotronEngine` does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipecat_nemotron.engine.config import DEFAULT_MODEL, LATENCY_MODES, EngineConfig
    from pipecat_nemotron.engine.engine import EngineInfo, NemotronEngine
    from pipecat_nemotron.engine.errors import (
        BoostingUnavailableError,
        BoostPhraseError,
        CapacityError,
        EngineNotRunningError,
        InvalidAudioError,
        ModelLoadError,
        NemotronEngineError,
        StreamClosedError,
        StreamFailedError,
    )
    from pipecat_nemotron.engine.scheduler import StepStats
    from pipecat_nemotron.engine.stream import ASRStream
    from pipecat_nemotron.engine.types import FinalTranscript, PeekTranscript, TranscriptUpdate, WordTiming

_EXPORTS = {
    "DEFAULT_MODEL": "pipecat_nemotron.engine.config",
    "LATENCY_MODES": "pipecat_nemotron.engine.config",
    "EngineConfig": "pipecat_nemotron.engine.config",
    "EngineInfo": "pipecat_nemotron.engine.engine",
    "NemotronEngine": "pipecat_nemotron.engine.engine",
    "BoostPhraseError": "pipecat_nemotron.engine.errors",
    "BoostingUnavailableError": "pipecat_nemotron.engine.errors",
    "CapacityError": "pipecat_nemotron.engine.errors",
    "EngineNotRunningError": "pipecat_nemotron.engine.errors",
    "InvalidAudioError": "pipecat_nemotron.engine.errors",
    "ModelLoadError": "pipecat_nemotron.engine.errors",
    "NemotronEngineError": "pipecat_nemotron.engine.errors",
    "StreamClosedError": "pipecat_nemotron.engine.errors",
    "StreamFailedError": "pipecat_nemotron.engine.errors",
    "StepStats": "pipecat_nemotron.engine.scheduler",
    "ASRStream": "pipecat_nemotron.engine.stream",
    "FinalTranscript": "pipecat_nemotron.engine.types",
    "PeekTranscript": "pipecat_nemotron.engine.types",
    "TranscriptUpdate": "pipecat_nemotron.engine.types",
    "WordTiming": "pipecat_nemotron.engine.types",
}

__all__ = [
    "ASRStream",
    "BoostPhraseError",
    "BoostingUnavailableError",
    "CapacityError",
    "DEFAULT_MODEL",
    "EngineConfig",
    "EngineInfo",
    "EngineNotRunningError",
    "FinalTranscript",
    "InvalidAudioError",
    "LATENCY_MODES",
    "ModelLoadError",
    "NemotronEngine",
    "NemotronEngineError",
    "PeekTranscript",
    "StepStats",
    "StreamClosedError",
    "StreamFailedError",
    "TranscriptUpdate",
    "WordTiming",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pipecat_nemotron.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
