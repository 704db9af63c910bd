"""The runtime settings of the Nemotron STT services, and the Pipecat language of a transcript.

Re-exported by :mod:`pipecat_nemotron.stt.base`, where both were defined before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipecat.services.settings import NOT_GIVEN, NotGiven, STTSettings
from pipecat.transcriptions.language import Language

from pipecat_nemotron.engine.languages import AUTO

__all__ = ["NemotronSTTSettings", "frame_language"]


def frame_language(language: str | None) -> Language | None:
    """Pipecat's ``Language`` for a transcript decoded with the prompt ``language``.

    None (an English-only model) is English; ``"auto"`` and a locale Pipecat does not know are None.
    """
    if language is None:
        return Language.EN
    if language == AUTO:
        return None
    try:
        return Language(language)
    except ValueError:
        return None


@dataclass
class NemotronSTTSettings(STTSettings):
    """Runtime-updatable settings of the Nemotron STT services (store and delta mode).

    Parameters
    ----------
        latency_ms: Latency mode, one of the model's (the English model: 80, 160, 560 or 1120 ms; the
            multilingual one adds 320). A change applies at once if the user is not mid-utterance, else at the
            next utterance boundary. The weights are shared; nothing reloads.
        language: (Pipecat's own field) the language of a multilingual model: Pipecat's ``Language``, a locale
            string (``"es-ES"``), a bare language (``"es"``) or ``"auto"``; None: the model's default. Changes
            apply at the next utterance boundary, like ``latency_ms``. An English-only model accepts English.

    """

    latency_ms: int | NotGiven = field(default_factory=lambda: NOT_GIVEN)
