"""Text to speech: the Magpie engine (:mod:`pipecat_nemotron.tts.magpie`, no Pipecat) and its Pipecat service.

Names load on first access: importing this package imports neither Pipecat nor NeMo.
"""

from __future__ import annotations

from pipecat_nemotron.runtime.lazy import lazy_exports

_EXPORTS = {
    "MagpieTTSService": "pipecat_nemotron.tts.service",
    "MagpieTTSSettings": "pipecat_nemotron.tts.service",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
