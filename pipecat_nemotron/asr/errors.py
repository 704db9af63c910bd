"""Exceptions raised by the streaming engine."""

from __future__ import annotations


class NemotronEngineError(Exception):
    """Base class of every error the engine raises."""


class ModelLoadError(NemotronEngineError):
    """The model could not be loaded, or it is not a cache-aware streaming model."""


class EngineNotRunningError(NemotronEngineError):
    """The engine was used before ``start()`` or after ``stop()``."""


class CapacityError(NemotronEngineError):
    """All ``max_streams`` stream slots are in use; existing streams are unaffected."""


class StreamClosedError(NemotronEngineError):
    """The stream was used after ``close()`` (or after it failed)."""


class InvalidAudioError(NemotronEngineError, ValueError):
    """Audio that cannot be transcribed: NaN/inf samples, an unsupported format or rate."""


class StreamFailedError(NemotronEngineError):
    """The model step failed for this stream alone; the stream is closed, other streams go on."""


class BoostPhraseError(NemotronEngineError, ValueError):
    """A phrase-boosting list that cannot be used.

    Too many phrases, a phrase too long or empty, a character the model cannot write, a bad ``boost_alpha``.
    Raised before anything changes: the stream is left as it was.
    """


class BoostingUnavailableError(NemotronEngineError):
    """Phrase boosting was asked for, but the engine cannot boost.

    The installed NeMo has no per-stream biasing (it needs nemo-toolkit 3.0.0 or later), or the engine was
    configured with ``max_boost_phrases=0``.
    """


class EndOfUtteranceUnavailableError(NemotronEngineError, ValueError):
    """End-of-utterance events were asked for (``eou=True``), but the model has no ``<EOU>`` token.

    The message names the models that have it (:data:`~pipecat_nemotron.asr.eou.EOU_MODELS`). Raised before
    anything changes: no stream is opened.
    """
