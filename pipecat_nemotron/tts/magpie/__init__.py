"""In-process Magpie TTS engine (NeMo ``MagpieTTSModel``), independent of Pipecat.

Importing this package does not import NeMo or torch; the engine loads them on its worker thread.
"""

from pipecat_nemotron.tts.magpie.engine import MagpieEngine
from pipecat_nemotron.tts.magpie.errors import MagpieEngineError, MagpieSynthesisError
from pipecat_nemotron.tts.magpie.loading import TTS_EXTRA_HINT, load_magpie_model
from pipecat_nemotron.tts.magpie.options import (
    DEFAULT_MAGPIE_MODEL,
    LANGUAGES,
    VOICES,
    MagpieSynthesisOptions,
    normalize_language,
    normalize_voice,
)
from pipecat_nemotron.tts.magpie.shared import SharedMagpieEngines, shared_magpie_engines
from pipecat_nemotron.tts.magpie.stream import AudioChunk, Synthesis, SynthesisStream

__all__ = [
    "DEFAULT_MAGPIE_MODEL",
    "LANGUAGES",
    "TTS_EXTRA_HINT",
    "VOICES",
    "AudioChunk",
    "MagpieEngine",
    "MagpieEngineError",
    "MagpieSynthesisError",
    "MagpieSynthesisOptions",
    "SharedMagpieEngines",
    "Synthesis",
    "SynthesisStream",
    "load_magpie_model",
    "normalize_language",
    "normalize_voice",
    "shared_magpie_engines",
]
