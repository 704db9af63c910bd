"""The runtime settings of the Nemotron STT services, and the Pipecat language of a transcript.

Re-exported by :mod:`pipecat_nemotron.stt.base`, where both were defined before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pipecat.services.settings import NOT_GIVEN, NotGiven, STTSettings, is_given
from pipecat.transcriptions.language import Language

from pipecat_nemotron.asr.boosting import (
    MAX_BOOST_PHRASE_CHARS_LIMIT,
    MAX_BOOST_PHRASES_LIMIT,
    validate_boost_alpha,
    validate_boost_phrases,
)
from pipecat_nemotron.asr.languages import AUTO

__all__ = ["NemotronSTTSettings", "check_boost_delta", "frame_language"]


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
        boost_phrases: Phrases to boost (names, product words), cased as the model writes them; empty: none.
            Changes apply from the next utterance. Too many or too long phrases, or characters the model
            cannot write, are refused (an ``ErrorFrame``; the phrases stay as they were).
        boost_alpha: Boosting weight; None: the engine's (or the server's) default. Applies with the phrases.

    """

    latency_ms: int | NotGiven = field(default_factory=lambda: NOT_GIVEN)
    boost_phrases: tuple[str, ...] | NotGiven = field(default_factory=lambda: NOT_GIVEN)
    boost_alpha: float | None | NotGiven = field(default_factory=lambda: NOT_GIVEN)

    def check_boost(self) -> None:
        """Normalise the given ``boost_phrases`` and check both boost fields for shape.

        The phrases become a tuple, whitespace collapsed, repeats removed. The model's own limits and characters
        are checked where the model is known.

        Raises:
            ValueError: Phrases that are not a list of strings (a bare string is refused), an empty phrase, or
                a weight outside (0, 10].

        """
        if is_given(self.boost_phrases):
            self.boost_phrases = validate_boost_phrases(
                self.boost_phrases, max_phrases=MAX_BOOST_PHRASES_LIMIT, max_chars=MAX_BOOST_PHRASE_CHARS_LIMIT
            )
        if is_given(self.boost_alpha) and self.boost_alpha is not None:
            self.boost_alpha = validate_boost_alpha(self.boost_alpha)


def check_boost_delta(delta: STTSettings, check: Callable[[tuple[str, ...]], None]) -> str | None:
    """Check a settings delta's boost fields; the refusal (both fields then dropped from ``delta``), or None.

    Args:
        delta: A delta whose ``boost_phrases`` are normalised in place (see :meth:`NemotronSTTSettings.check_boost`).
        check: The service's check of phrases against its model or server (raises ``ValueError``).

    """
    if not isinstance(delta, NemotronSTTSettings):
        return None
    try:
        delta.check_boost()
        if is_given(delta.boost_phrases):
            check(delta.boost_phrases)
    except ValueError as e:
        delta.boost_phrases = delta.boost_alpha = NOT_GIVEN
        return f"boost phrases unchanged: {e}"
    return None
