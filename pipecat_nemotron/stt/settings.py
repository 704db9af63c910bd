"""The runtime settings of the Nemotron STT services, their checks, and the Pipecat language of a transcript.

The checks: at construction (:func:`initial_settings`) and of a settings delta against what the service knows of
its model now (:func:`delta_refusals`). ``NemotronSTTSettings`` and ``frame_language`` are re-exported by
:mod:`pipecat_nemotron.stt.base`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipecat.services.settings import NOT_GIVEN, NotGiven, STTSettings, is_given
from pipecat.transcriptions.language import Language

from pipecat_nemotron.asr.boosting import (
    MAX_BOOST_PHRASE_CHARS_LIMIT,
    MAX_BOOST_PHRASES_LIMIT,
    validate_boost_alpha,
    validate_boost_phrases,
)
from pipecat_nemotron.asr.config import validate_latency_ms
from pipecat_nemotron.asr.languages import AUTO, language_code

__all__ = ["NemotronSTTSettings", "check_boost_delta", "delta_refusals", "frame_language", "initial_settings"]


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


def initial_settings(
    *,
    latency_ms: int,
    model: str | None,
    language: Language | str | None,
    boost_phrases: Sequence[str] | None,
    boost_alpha: float | None,
    settings: NemotronSTTSettings | None,
) -> NemotronSTTSettings:
    """A service's settings at construction: its arguments, overridden by ``settings``, checked for shape.

    The model's own modes, languages and characters are checked where the model is known.

    Raises:
        ValueError: Unsupported latency (the message names the allowed values), language or boost setting.

    """
    validate_latency_ms(latency_ms)
    if language is not None:
        language_code(language)
    initial = NemotronSTTSettings(model=model, language=language, latency_ms=latency_ms)
    initial.boost_phrases, initial.boost_alpha = boost_phrases, boost_alpha  # type: ignore[assignment]
    if settings is not None:
        initial.apply_update(settings)
    validate_latency_ms(initial.latency_ms)  # type: ignore[arg-type]
    initial.check_boost()
    return initial


def delta_refusals(
    delta: STTSettings,
    *,
    model: str | None,
    latency_modes: Callable[[], tuple[int, ...] | None],
    language_problem: Callable[[Any], str | None],
    model_refusal: Callable[[], str],
    check_boost: Callable[[tuple[str, ...]], None],
) -> list[str]:
    """Drop from ``delta`` what the service cannot apply; the refusals, in field order, for its ``ErrorFrame`` s.

    Refused: a ``latency_ms`` that is not a mode, a ``language`` the model cannot decode, another model, and a
    boost list over the limits or refused by ``check_boost`` (both boost fields are then dropped).

    Args:
        delta: A settings delta, changed in place.
        model: The model the service runs (the settings' ``model``).
        latency_modes: The model's latency modes, ms (None while unknown: any multiple of 80 ms passes).
        language_problem: Why the model cannot decode a language (None: it can, or the model is not known yet).
        model_refusal: The refusal of a model change.
        check_boost: The check of phrases against the model or server (raises ``ValueError``).

    """
    refusals = []
    latency_ms = getattr(delta, "latency_ms", NOT_GIVEN)
    if is_given(latency_ms):
        try:
            validate_latency_ms(latency_ms, latency_modes())
        except ValueError as e:
            refusals.append(str(e))
            delta.latency_ms = NOT_GIVEN  # type: ignore[attr-defined]
    if is_given(delta.language) and delta.language is not None:
        try:
            problem = language_problem(delta.language)
        except ValueError as e:
            problem = str(e)
        if problem is not None:
            refusals.append(problem)
            delta.language = NOT_GIVEN
    if is_given(delta.model) and delta.model != model:
        refusals.append(model_refusal())
        delta.model = NOT_GIVEN
    refusal = check_boost_delta(delta, check_boost)
    if refusal is not None:
        refusals.append(refusal)
    return refusals
