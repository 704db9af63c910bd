"""``StreamRules``: what a stream may ask of the loaded model (latency mode, language, boost list, eou), checked.

The one place a stream's requests are validated, when it opens and when it changes them: nothing here touches a
stream or the scheduler, so a refused request changes nothing. :class:`~pipecat_nemotron.asr.NemotronEngine`
builds one per loaded model.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipecat_nemotron.asr.boosting import BoostList, BoostRules
from pipecat_nemotron.asr.config import EngineConfig, validate_latency_ms
from pipecat_nemotron.asr.languages import resolve_prompt

if TYPE_CHECKING:
    from pipecat_nemotron.asr.runner import ModelRunner

__all__ = ["StreamRules"]


class StreamRules:
    """A loaded model's answers to a stream's requests: its latency modes, languages and boosting.

    Args:
        config: The engine's settings (defaults and boost limits).
        runner: The loaded model's runner (its modes, language prompts, alphabet and boosting trees).

    """

    def __init__(self, config: EngineConfig, runner: ModelRunner) -> None:
        self._config = config
        self._runner = runner

    @property
    def languages(self) -> tuple[str, ...]:
        """The prompt keys a stream can ask for: the locales in index order, then ``"auto"`` if the model has it."""
        prompts = self._runner.prompts
        if prompts is None:
            return ()
        return prompts.languages + (("auto",) if prompts.has_auto else ())

    def latency(self, latency_ms: int) -> int:
        """``latency_ms`` if it is one of the loaded model's modes.

        Raises:
            ValueError: Not one of the model's modes (names them).

        """
        return validate_latency_ms(latency_ms, self._runner.modes)

    def language(self, language: Any) -> tuple[str | None, int | None]:
        """``(prompt key, one-hot index)`` of a requested language (None: the config's default).

        Raises:
            ValueError: The model has no such language (the message lists the model's), or an English-only
                model is asked for another language.

        """
        requested = self._config.default_language if language is None else language
        return resolve_prompt(self._runner.prompts, requested, self._config.model)

    @property
    def has_eou(self) -> bool:
        """The model emits ``<EOU>``: streams may ask for end-of-utterance events."""
        return self._runner.markers.eou is not None

    def eou(self, requested: bool | None) -> bool:
        """Whether a stream gets end-of-utterance events (None: the config's ``eou``).

        Raises:
            EndOfUtteranceUnavailableError: Asked for on a model without ``<EOU>`` (names the models with it).
            ValueError: Neither a bool nor None.

        """
        from pipecat_nemotron.asr.eou import eou_unavailable_message
        from pipecat_nemotron.asr.errors import EndOfUtteranceUnavailableError

        eou = self._config.eou if requested is None else requested
        if not isinstance(eou, bool):
            raise ValueError(f"eou must be True, False or None (the engine's default), got {requested!r}")
        if eou and not self.has_eou:
            raise EndOfUtteranceUnavailableError(eou_unavailable_message(self._config.model))
        return eou

    def boost(self, phrases: Sequence[str] | None, alpha: float | None) -> BoostList:
        """Validate a stream's list (:class:`~.boosting.BoostRules`); start building its tree off the model thread.

        Raises:
            BoostPhraseError: A list over the limits or with characters the model cannot write.
            BoostingUnavailableError: Phrases given, but the decoder has no per-stream biasing.

        """
        from pipecat_nemotron.asr.loading import boosting_unavailable

        runner, config = self._runner, self._config
        unavailable = None if runner.boost is not None else functools.partial(boosting_unavailable, config)
        limits = (config.max_boost_phrases, config.max_boost_phrase_chars, config.default_boost_alpha)
        boost = BoostRules(*limits, runner.alphabet, Path(config.model).name, unavailable).resolve(phrases, alpha)
        if runner.boost is not None and not boost.empty:
            runner.boost.prebuild(boost)  # the step that first needs it takes it (or waits for it)
        return boost
