"""The streaming ASR engine: model loading, per-stream state and the batching scheduler. Imports no Pipecat."""

from pipecat_nemotron.engine.config import DEFAULT_MODEL, LATENCY_MODES, EngineConfig
from pipecat_nemotron.engine.engine import EngineInfo, NemotronEngine
from pipecat_nemotron.engine.errors import (
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

__all__ = [
    "DEFAULT_MODEL",
    "LATENCY_MODES",
    "ASRStream",
    "CapacityError",
    "EngineConfig",
    "EngineInfo",
    "EngineNotRunningError",
    "FinalTranscript",
    "InvalidAudioError",
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
